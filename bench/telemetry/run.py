"""Telemetry bench: ingest rate, SDK log() → websocket latency, 200-client fan-out, downsampling.

Run from the repo root: ``.venv/bin/python bench/telemetry/run.py``. It creates (and drops) its own
PostgreSQL database and starts its own redis-server, daphne and ``manage.py ingest`` processes.

Producer: a subprocess logs points through the SDK's writer (one per rank, as two ranks would:
the ``log()`` hot path, its buffering and flusher thread, its files) and the agent's real
shipper (workers.agent.shipper.TelemetryShipper) tails the files and XADDs batches, as on a host.
Each record carries the time of its log call as the value of the series ``t_append``, so a
client computes log() → arrival latency for every point of every frame it receives.

Ingest rate: a prefilled stream of 250,000 points drained by ``manage.py ingest``, against a bare
COPY of the same rows (the same binary data ingest sends) into telemetry_metric with its unique
index, alternately on emptied tables: ``ingest_copy_ratio`` is ingest's rate over the COPY's,
``ingest_copy_cpu_ratio`` the COPY's CPU per row over ingest's (its process and PostgreSQL
backends), which depends far less on how loaded the machine is. Every phase runs ``--reps`` times
(5); figures are medians with their ranges, and the 1-min load average is reported alongside.
Each phase prints how long it took; the whole run takes about 6-8 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.telemetry.live import FANOUT_CLIENTS, LIVE_RATE, bench_job, live_phases, produce  # noqa: E402
from bench.telemetry.rate import RATE_RANKS, rate_phase  # noqa: E402

BENCH_DB = f"ty_telemetry_bench_{os.getpid()}"
DOWNSAMPLE_POINTS = 1_000_000
DOWNSAMPLE_RUNS = 7
REPS = 5
KEYS = [
    "ingest_copy_ratio",
    "ingest_copy_ratio_range",
    "ingest_points_per_s",
    "ingest_points_per_s_range",
    "raw_copy_rows_per_s",
    "raw_copy_rows_per_s_range",
    "ingest_copy_cpu_ratio",
    "ingest_copy_cpu_ratio_range",
    "ingest_cpu_us_per_point",
    "ingest_process_cpu_us_per_point",
    "ingest_backend_cpu_us_per_point",
    "raw_copy_cpu_us_per_row",
    "rate_load_avg_1m",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p95_ms_range",
    "fanout_clients",
    "fanout_p95_ms",
    "fanout_p95_ms_range",
    "fanout_gaps",
    "fanout_published_p95_ms",
    "fanout_hop_p95_ms",
    "fanout_failed_clients",
    "fanout_load_avg_1m",
    "downsample_1m_ms",
    "reps",
    "phase_seconds",
    "total_seconds",
]


def bench_downsample(points: int) -> tuple[float, int]:
    """Store a 1,000,000-point series the way ingest does (raw points and their tiles), then time
    the query that turns it into at most 1,000 buckets."""
    from django.db import connection, transaction

    from console.jobs.models import Job
    from console.telemetry.downsample import query_series
    from console.telemetry.ingest.storage import MetricBatch, store_metrics

    job = Job.objects.create(name="downsample-bench", workload="mlp", round_number=1)
    t0 = time.time()
    chunk = 100_000
    for first in range(0, points, chunk):
        rows = [
            (job.pk, 1, 0, step, step, "loss", ((step * 7919) % 10007) / 10007.0, t0)
            for step in range(first, min(points, first + chunk))
        ]
        with transaction.atomic():
            store_metrics(MetricBatch.of(rows), replay=False)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE telemetry_metric")
        cur.execute("VACUUM ANALYZE telemetry_metricrollup")
    timings = []
    buckets = []
    for _ in range(DOWNSAMPLE_RUNS):
        started = time.perf_counter()
        buckets = query_series(job.pk, "loss", points=1000)
        timings.append((time.perf_counter() - started) * 1000)
    assert sum(b.count for b in buckets) == points and len(buckets) <= 1000
    assert min(b.min for b in buckets) == 0.0
    return statistics.median(timings), len(buckets)


def took(figures: dict[str, Any], phase: str, started: float) -> None:
    seconds = round(time.monotonic() - started)
    figures.setdefault("phase_seconds", {})[phase] = seconds
    print(f"{phase} phase took {seconds} s", flush=True)


def main(phases: set[str], frame_interval: float | None, reps: int, keep_logs: bool) -> None:
    bench_started = time.monotonic()
    figures: dict[str, Any] = {}
    with harness.Bench("telemetry", database=BENCH_DB, redis="private", keep=keep_logs) as bench:
        from django.contrib.auth.models import User

        from tests.support.telemetry import session_cookie

        cookie = session_cookie(User.objects.create_user("bench", password="bench-pw-1"))
        if "ingest" in phases:
            phase_started = time.monotonic()
            rate_job = bench_job("rate-bench", RATE_RANKS)
            figures.update(rate_phase(rate_job, reps, bench.database_url, bench.redis_url, bench.console))
            print(
                f"ingest: median {figures['ingest_points_per_s']:,} points/s "
                f"{figures['ingest_points_per_s_range']}, raw COPY {figures['raw_copy_rows_per_s']:,} rows/s "
                f"{figures['raw_copy_rows_per_s_range']}, ratio {figures['ingest_copy_ratio']} "
                f"{figures['ingest_copy_ratio_range']} over {reps} reps",
                flush=True,
            )
            took(figures, "ingest", phase_started)
        if phases & {"latency", "fanout"}:
            phase_started = time.monotonic()
            live_phases(
                phases,
                figures,
                cookie=cookie,
                redis_url=bench.redis_url,
                console=bench.console,
                tmp=bench.root,
                frame_interval=frame_interval,
                reps=reps,
            )
            took(figures, "live", phase_started)
        if "downsample" in phases:
            phase_started = time.monotonic()
            ms, nbuckets = bench_downsample(DOWNSAMPLE_POINTS)
            figures["downsample_1m_ms"] = round(ms, 1)
            print(
                f"downsample: {DOWNSAMPLE_POINTS:,} -> {nbuckets} buckets in {ms:.1f} ms "
                f"(median of {DOWNSAMPLE_RUNS})"
            )
            took(figures, "downsample", phase_started)

    def fig(key: str, unit: str = "") -> str:
        return f"{figures[key]:,}{unit}" if key in figures else "-"

    def spread(key: str) -> str:
        return f" [{figures[key][0]:,}-{figures[key][1]:,}]" if key in figures else ""

    rows = [
        (
            "ingest into PostgreSQL",
            fig("ingest_points_per_s", " points/s") + spread("ingest_points_per_s_range"),
            "",
        ),
        (
            "raw COPY, same rows",
            fig("raw_copy_rows_per_s", " rows/s") + spread("raw_copy_rows_per_s_range"),
            "",
        ),
        ("ingest_copy_ratio", fig("ingest_copy_ratio") + spread("ingest_copy_ratio_range"), ">= 0.8"),
        (
            "ingest_copy_cpu_ratio (CPU per point)",
            fig("ingest_copy_cpu_ratio") + spread("ingest_copy_cpu_ratio_range"),
            "",
        ),
        ("SDK log() -> websocket p50 @10k pts/s", fig("latency_p50_ms", " ms"), ""),
        (
            "SDK log() -> websocket p95 @10k pts/s",
            fig("latency_p95_ms", " ms") + spread("latency_p95_ms_range"),
            "<= 250",
        ),
        ("fan-out clients receiving frames (min)", f"{fig('fanout_clients')} / {FANOUT_CLIENTS}", "200"),
        ("fan-out p50 @10k pts/s", fig("fanout_p50_ms", " ms") + spread("fanout_p50_ms_range"), ""),
        ("fan-out p95 @10k pts/s", fig("fanout_p95_ms", " ms") + spread("fanout_p95_ms_range"), "<= 250"),
        ("fan-out frame gaps (all clients, reps)", fig("fanout_gaps"), "0"),
        (
            "fan-out: as published, p95",
            fig("fanout_published_p95_ms", " ms") + spread("fanout_published_p95_ms_range"),
            "(ingest's share)",
        ),
        (
            "fan-out: hop published -> client p95",
            fig("fanout_hop_p95_ms", " ms") + spread("fanout_hop_p95_ms_range"),
            "(fan-out's share)",
        ),
        ("downsample 1M -> 1,000 (median)", fig("downsample_1m_ms", " ms"), "<= 100"),
    ]
    print()
    print(
        f"Medians over {reps} reps [min-max]; {os.cpu_count()} cores, 1-min load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'measure':40} {'result':>36}  target")
    for name, value, target in rows:
        print(f"{name:40} {value:>36}  {target}")
    figures["reps"] = reps
    figures["total_seconds"] = round(time.monotonic() - bench_started)
    harness.print_json(figures, KEYS)  # a NaN (a phase that measured nothing) as null


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--produce", type=int, help="(internal) run the producer for this job id")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--redis")
    parser.add_argument(
        "--phases", default="ingest,latency,fanout,downsample", help="comma-separated subset to run"
    )
    parser.add_argument("--frame-interval", type=float, help="pass to manage.py ingest (default: its own)")
    parser.add_argument("--reps", type=int, default=REPS, help="repetitions of each measured phase")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (else removed)")
    args = parser.parse_args()
    if args.produce is not None:
        produce(args.produce, LIVE_RATE, args.seconds, args.workdir, args.redis)
    else:
        # SIGTERM and Ctrl-C unwind main(); every process it started is stopped on the way out.
        harness.run(main, set(args.phases.split(",")), args.frame_interval, args.reps, args.keep_logs)
