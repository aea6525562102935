"""The telemetry bench's rate phase: ``manage.py ingest`` draining a prefilled stream, against a
bare COPY of the same rows into telemetry_metric (its unique index and all), alternately on
emptied tables (bench/telemetry/run.py)."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from bench.telemetry.live import BENCH_NODE, BENCH_NODE_SECRET
from tests.support.services import Console

# Ingest rate: a prefilled stream of this many agent batches (250,000 points: enough for a steady
# rate; 500,000 took the whole bench past its 10 minutes on a loaded machine).
RATE_BATCHES = 200
RATE_RECORDS_PER_BATCH = 250
RATE_VALUES = ("loss", "lr", "grad_norm", "throughput", "step_time")
RATE_RANKS = 4


def rate_payloads(job_id: int) -> list[str]:
    """RATE_BATCHES agent batches of RATE_RECORDS_PER_BATCH records (RATE_RANKS ranks, 5 values
    each), as BENCH_NODE ships them."""
    payloads = []
    step = 0
    t = time.time()
    for i in range(RATE_BATCHES):
        rank = i % RATE_RANKS
        records = [
            {
                "kind": "metric",
                "seq": step + j,
                "t": t + (step + j) * 1e-3,
                "step": step + j,
                "values": {name: 0.5 + j * 1e-3 for name in RATE_VALUES},
            }
            for j in range(RATE_RECORDS_PER_BATCH)
        ]
        if rank == RATE_RANKS - 1:
            step += RATE_RECORDS_PER_BATCH
        payload = {"job_id": job_id, "round": 1, "rank": rank, "node": BENCH_NODE, "records": records}
        payloads.append(json.dumps(payload))
    return payloads


def empty_metric_tables(database_url: str) -> None:
    """Every measurement starts on empty tables, so reps and the two writers compare alike."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE telemetry_metric, telemetry_metricrollup")


def backends_of(pid: int, database_url: str) -> list[int]:
    """PostgreSQL backend pids serving process ``pid``'s connections (same host)."""
    import psutil
    import psycopg

    ports = [
        c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr and c.raddr.port == 5432
    ]
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", [ports]
        ).fetchall()
    return [int(row[0]) for row in rows]


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class RateIngest:
    """The one ``manage.py ingest`` of the rate phase: started once, so that its start-up is not
    what is measured, and given a prefilled stream at each rep."""

    def __init__(self, database_url: str, redis_url: str, console: Console) -> None:
        import redis

        from workers.protocol import TELEMETRY_STREAM

        self.database_url = database_url
        self.client = redis.Redis.from_url(redis_url)
        self.client.delete(TELEMETRY_STREAM)
        self.proc = console.start_ingest("bench-rate")
        self.pids: list[int] = []
        # Per rep: CPU seconds per point of the ingest process, and of its PostgreSQL backends.
        self.split: list[tuple[float, float]] = []

    def acked(self) -> int:
        import redis

        from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

        try:
            groups = self.client.xinfo_groups(TELEMETRY_STREAM)
            info = next(g for g in groups if g["name"] in (TELEMETRY_GROUP, TELEMETRY_GROUP.encode()))
        except (StopIteration, redis.ResponseError):
            return 0
        return int(info["entries-read"] or 0) - int(info["pending"])

    def measure(self, payloads: list[str]) -> tuple[float, float]:
        """Points/s draining ``payloads`` (sealed by BENCH_NODE, as its agent would), and the CPU
        seconds per point that ingest and its PostgreSQL backends used meanwhile."""
        from workers.protocol import TELEMETRY_STREAM
        from workers.signing import report_key, telemetry_entry

        key = report_key(BENCH_NODE_SECRET)
        base = self.acked()
        pipe = self.client.pipeline(transaction=True)  # MULTI: ingest sees none of them or all
        for payload in payloads:
            pipe.xadd(TELEMETRY_STREAM, telemetry_entry(key, BENCH_NODE, payload))
        pipe.execute()
        samples: list[tuple[float, int, float, float]] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            acked = self.acked() - base
            now = time.monotonic()
            if acked > 0:
                if not self.pids:  # by its first commit, ingest holds both of its connections
                    self.pids = [self.proc.pid, *backends_of(self.proc.pid, self.database_url)]
                samples.append((now, acked, cpu_of(self.pids[:1]), cpu_of(self.pids[1:])))
            if acked >= len(payloads):
                break
            time.sleep(0.02)
        if len(samples) < 2:
            raise RuntimeError("ingest made no progress")
        (t0, a0, p0, b0), (t1, a1, p1, b1) = samples[0], samples[-1]
        points = (a1 - a0) * RATE_RECORDS_PER_BATCH * len(RATE_VALUES)
        self.split.append(((p1 - p0) / points, (b1 - b0) / points))
        return points / (t1 - t0), (p1 - p0 + b1 - b0) / points


def bench_raw_copy(data: bytes, rows: int, database_url: str) -> tuple[float, float]:
    """Rows/s of one bare COPY of the same points straight into telemetry_metric (its unique
    index and all): what PostgreSQL alone can take, the baseline for ingest_copy_ratio. Only the
    COPY and its commit are timed. Also the CPU seconds per row its backend and this process used."""
    import psycopg

    from console.telemetry.ingest.storage import METRIC_COPY

    with psycopg.connect(database_url) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        conn.commit()
        pids = [int(backend[0])] if backend else []
        cpu, own = cpu_of(pids), time.process_time()
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy(METRIC_COPY) as copy:
            copy.write(data)
        conn.commit()
        elapsed = time.perf_counter() - started
        used = cpu_of(pids) - cpu + time.process_time() - own
    return rows / elapsed, used / rows


def rate_phase(job_id: int, reps: int, database_url: str, redis_url: str, console: Console) -> dict[str, Any]:
    """Ingest and the raw COPY, alternately (which goes first alternates too), ``reps`` times."""
    from console.telemetry.ingest.decoding import decode_entries
    from console.telemetry.ingest.storage import copy_data

    payloads = rate_payloads(job_id)
    rows = decode_entries((b"0-0", {b"batch": p.encode()}) for p in payloads).metrics
    data = copy_data(rows)  # the format ingest sends
    ingest = RateIngest(database_url, redis_url, console)
    ingest_rates: list[float] = []
    copy_rates: list[float] = []
    ingest_cpu: list[float] = []
    copy_cpu: list[float] = []
    loads: list[float] = []
    for rep in range(reps):
        order = ("ingest", "copy") if rep % 2 == 0 else ("copy", "ingest")
        for which in order:
            empty_metric_tables(database_url)
            loads.append(os.getloadavg()[0])
            if which == "ingest":
                rate, cpu = ingest.measure(payloads)
                ingest_rates.append(rate)
                ingest_cpu.append(cpu)
            else:
                rate, cpu = bench_raw_copy(data, len(rows), database_url)
                copy_rates.append(rate)
                copy_cpu.append(cpu)
        print(
            f"rate rep {rep + 1}/{reps}: ingest {ingest_rates[-1]:,.0f} points/s "
            f"({ingest_cpu[-1] * 1e6:.1f} CPU us/point), raw COPY {copy_rates[-1]:,.0f} rows/s "
            f"({copy_cpu[-1] * 1e6:.1f} CPU us/row), ratio {ingest_rates[-1] / copy_rates[-1]:.2f} "
            f"(1-min load {loads[-1]:.1f})",
            flush=True,
        )
    # (The live phases' ingest is another consumer of the same group: this one must be gone.)
    console.stop_process(ingest.proc)
    ingest.client.close()
    ratios = [i / c for i, c in zip(ingest_rates, copy_rates, strict=True)]
    cpu_ratios = [c / i for i, c in zip(ingest_cpu, copy_cpu, strict=True)]
    return {
        "ingest_points_per_s": round(statistics.median(ingest_rates)),
        "ingest_points_per_s_range": [round(min(ingest_rates)), round(max(ingest_rates))],
        "raw_copy_rows_per_s": round(statistics.median(copy_rates)),
        "raw_copy_rows_per_s_range": [round(min(copy_rates)), round(max(copy_rates))],
        "ingest_copy_ratio": round(statistics.median(ratios), 3),
        "ingest_copy_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        # CPU cost per point of the raw COPY over ingest's (its process and its backends): what
        # the rate ratio would be with a core free for each, and far less sensitive to load.
        "ingest_copy_cpu_ratio": round(statistics.median(cpu_ratios), 3),
        "ingest_copy_cpu_ratio_range": [round(min(cpu_ratios), 3), round(max(cpu_ratios), 3)],
        "ingest_cpu_us_per_point": round(statistics.median(ingest_cpu) * 1e6, 2),
        "ingest_process_cpu_us_per_point": round(statistics.median(p for p, _ in ingest.split) * 1e6, 2),
        "ingest_backend_cpu_us_per_point": round(statistics.median(b for _, b in ingest.split) * 1e6, 2),
        "raw_copy_cpu_us_per_row": round(statistics.median(copy_cpu) * 1e6, 2),
        "rate_load_avg_1m": round(statistics.median(loads), 1),
    }
