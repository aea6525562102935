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
import asyncio
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support import procs as children  # noqa: E402  (`procs` names a Processes here)

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = f"ty_telemetry_bench_{os.getpid()}"

# Ingest rate: a prefilled stream of this many agent batches (250,000 points: enough for a steady
# rate; 500,000 took the whole bench past its 10 minutes on a loaded machine).
RATE_BATCHES = 200
RATE_RECORDS_PER_BATCH = 250
RATE_VALUES = ("loss", "lr", "grad_norm", "throughput", "step_time")
# Live phases: 10,000 points/s = 2 ranks x 1,000 records/s x 5 values.
LIVE_RATE = 10_000
LIVE_RANKS = 2
LIVE_VALUES = 5
LATENCY_SECONDS = 6.0
FANOUT_CLIENTS = 200
FANOUT_SECONDS = 8.0
WARMUP_SECONDS = 2.0
RAMP_BATCH = 10
DOWNSAMPLE_POINTS = 1_000_000
DOWNSAMPLE_RUNS = 7
REPS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- producer subprocess ---------------------------------------------------------------------
def produce(job_id: int, rate: int, seconds: float, workdir: Path, redis_url: str) -> None:
    """Log ``rate`` points/s through the SDK's own writer (workers.sdk.telemetry.Telemetry: the
    ``log()`` hot path, its flusher thread and its files), one writer per rank, and ship them with
    the agent's real shipper. Each record's ``t_append`` value is the time of its log call."""
    from workers.agent.shipper import TelemetryShipper
    from workers.sdk.telemetry import Telemetry

    shipper = TelemetryShipper(redis_url, node="bench")
    writers = {}
    for rank in range(LIVE_RANKS):
        paths = [workdir / f"rank{rank}.{suffix}" for suffix in ("jsonl", "out", "err")]
        for path in paths:
            path.touch()
        shipper.add(job_id, 1, rank, *paths)
        writers[rank] = Telemetry(str(paths[0]), 0, rank)
    shipper.start()
    per_rank = rate / LIVE_VALUES / LIVE_RANKS
    written = 0
    start = time.time()
    # The viewers' clock starts now: this process's imports (torch, through workers.sdk) took
    # longer than a whole phase on a loaded machine.
    (workdir / "producing").touch()
    while (now := time.time()) - start < seconds:
        due = int((now - start) * per_rank)
        for step in range(written, due):
            for rank, writer in writers.items():
                writer.metric(
                    step,
                    {
                        "loss": 1.0 / (step + 1),
                        "lr": 0.001,
                        "grad_norm": 1.0 + (step % 7) * 0.01,
                        "throughput": 512.0 + rank,
                        "t_append": time.time(),
                    },
                )
        written = max(written, due)
        time.sleep(0.001)
    for writer in writers.values():
        writer.close()
    time.sleep(0.5)
    shipper.stop()
    print(json.dumps({"records_per_rank": written}), flush=True)


# --- helpers ---------------------------------------------------------------------------------
class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        proc = children.spawn(args, cwd=REPO, env=env, log=log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        children.stop(proc, grace=15)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


# --- phases ----------------------------------------------------------------------------------
def rate_payloads(job_id: int) -> list[str]:
    """RATE_BATCHES agent batches of RATE_RECORDS_PER_BATCH records (4 ranks, 5 values each)."""
    payloads = []
    step = 0
    t = time.time()
    for i in range(RATE_BATCHES):
        rank = i % 4
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
        if rank == 3:
            step += RATE_RECORDS_PER_BATCH
        payload = {"job_id": job_id, "round": 1, "rank": rank, "node": "bench", "records": records}
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

    def __init__(self, database_url: str, redis_url: str, env: dict[str, str], procs: Processes, logs: Path):
        import redis

        from workers.protocol import TELEMETRY_STREAM

        self.database_url = database_url
        self.client = redis.Redis.from_url(redis_url)
        self.client.delete(TELEMETRY_STREAM)
        self.proc = procs.start(
            [sys.executable, "manage.py", "ingest", "--consumer", "bench-rate"], env, logs / "ingest-rate.log"
        )
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
        """Points/s draining ``payloads``, and the CPU seconds per point that ingest and its
        PostgreSQL backends used meanwhile."""
        from workers.protocol import TELEMETRY_STREAM

        base = self.acked()
        pipe = self.client.pipeline(transaction=True)  # MULTI: ingest sees none of them or all
        for payload in payloads:
            pipe.xadd(TELEMETRY_STREAM, {"batch": payload})
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


def rate_phase(
    job_id: int,
    reps: int,
    database_url: str,
    redis_url: str,
    env: dict[str, str],
    procs: Processes,
    logs: Path,
) -> dict[str, Any]:
    """Ingest and the raw COPY, alternately (which goes first alternates too), ``reps`` times."""
    from console.telemetry.ingest.decoding import decode_entries
    from console.telemetry.ingest.storage import copy_data

    payloads = rate_payloads(job_id)
    rows = decode_entries((b"0-0", {b"batch": p.encode()}) for p in payloads).metrics
    data = copy_data(rows)  # the format ingest sends
    ingest = RateIngest(database_url, redis_url, env, procs, logs)
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
    procs.stop(ingest.proc)
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


async def watch(
    url: str, cookie: str, seconds: float, ready: asyncio.Event, go: asyncio.Event, result: dict[str, Any]
) -> None:
    """One viewer. A failed handshake (daphne drops a socket its consumer has not accepted
    within 5 s when the machine is overloaded) is recorded, not fatal: it shows up as a client
    that received nothing."""
    from websockets.asyncio.client import connect

    latencies: list[float] = []
    frames: list[int] = []
    arrivals: dict[int, float] = {}
    result.update(latencies=latencies, frames=0, gaps=0, last=None, error=None, arrivals=arrivals)
    try:
        async with connect(
            url,
            origin="http://127.0.0.1",  # type: ignore[arg-type]
            additional_headers={"Cookie": cookie},
            compression=None,
            max_queue=None,
            open_timeout=60,
        ) as ws:
            state = json.loads(await ws.recv())
            assert state["type"] == "state", state
            ready.set()
            await go.wait()
            start = time.time()
            end = start + seconds
            while (remaining := end - time.time()) > 0:
                try:
                    raw = await asyncio.wait_for(ws.recv(), remaining)
                except TimeoutError:
                    break
                arrived = time.time()
                message = json.loads(raw)
                if message.get("type") != "metrics":
                    continue
                frames.append(message["frame"])
                arrivals[message["frame"]] = arrived
                if arrived - start < WARMUP_SECONDS:
                    continue
                latencies.extend(
                    arrived - v for _, v in message["series"].get("t_append", []) if v is not None
                )
    except Exception as exc:
        result["error"] = repr(exc)
    finally:
        ready.set()
    gaps = sum(max(0, b - a - 1) for a, b in itertools.pairwise(frames))
    result.update(frames=len(frames), gaps=gaps, last=frames[-1] if frames else None)


async def tap_frames(
    url: str, channel: str, seconds: float, go: asyncio.Event, into: list[float], seen: dict[int, float]
) -> None:
    """Latencies of the frames as published, before any web process fans them out: the part of
    the viewers' latency that ingest (not fan-out) accounts for. ``seen`` maps each frame to when
    it was published, to time the fan-out hop alone."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(channel)
        await go.wait()
        start = time.time()
        while time.time() - start < seconds:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is None or message["type"] != "message":
                continue
            arrived = time.time()
            frame = json.loads(message["data"])
            seen[frame["frame"]] = arrived
            if arrived - start < WARMUP_SECONDS:
                continue
            into.extend(arrived - v for _, v in frame["series"].get("t_append", []) if v is not None)
    finally:
        await pubsub.aclose()
        await client.aclose()


async def run_clients(
    url: str, cookie: str, clients: int, seconds: float, start_producer: Any, tap: tuple[str, str]
) -> tuple[list[dict[str, Any]], list[float]]:
    results: list[dict[str, Any]] = [{} for _ in range(clients)]
    readies = [asyncio.Event() for _ in range(clients)]
    go = asyncio.Event()
    tasks = []
    published: list[float] = []
    seen: dict[int, float] = {}
    tapping = asyncio.create_task(tap_frames(*tap, seconds, go, published, seen))
    for i in range(clients):
        tasks.append(asyncio.create_task(watch(url, cookie, seconds, readies[i], go, results[i])))
        # A ramp, as browsers arrive: each ten wait for the previous ten's handshakes. Daphne drops
        # a socket whose consumer has not accepted within its websocket_connect_timeout (5 s), and
        # on a loaded machine a burst of 200 logins (session and user queries on Channels' one
        # database thread) took longer than that; this phase measures delivery, not a login storm.
        if i % RAMP_BATCH == RAMP_BATCH - 1:
            await asyncio.wait_for(
                asyncio.gather(*(r.wait() for r in readies[i + 1 - RAMP_BATCH : i + 1])), 120
            )
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    await asyncio.to_thread(start_producer)
    go.set()
    await asyncio.gather(*tasks, tapping)
    for result in results:
        result["hops"] = [t - seen[n] for n, t in result["arrivals"].items() if n in seen]
    return results, published


def live_phase(
    job_id: int,
    clients: int,
    seconds: float,
    *,
    cookie: str,
    ws_port: int,
    redis_url: str,
    env: dict[str, str],
    procs: Processes,
    logs: Path,
    workdir: Path,
) -> tuple[list[dict[str, Any]], list[float]]:
    producer: list[subprocess.Popen[bytes]] = []

    def start_producer() -> None:
        """Start the producer and return once it produces (run off the clients' event loop)."""
        producer.append(
            procs.start(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--produce",
                    str(job_id),
                    "--seconds",
                    str(seconds + 1.0),
                    "--workdir",
                    str(workdir),
                    "--redis",
                    redis_url,
                ],
                env,
                logs / f"producer-{clients}.log",
            )
        )
        deadline = time.monotonic() + 120
        while not (workdir / "producing").exists():
            if time.monotonic() > deadline or producer[-1].poll() is not None:
                raise RuntimeError("the producer did not start")
            time.sleep(0.05)

    from console.telemetry.fanout import frame_channel

    url = f"ws://127.0.0.1:{ws_port}/ws/jobs/{job_id}/"
    # The web process's hub subscribes to this channel (db 0: the bench's own redis-server).
    tap = (redis_url, frame_channel(job_id, 0))
    results, published = asyncio.run(run_clients(url, cookie, clients, seconds, start_producer, tap))
    for proc in producer:
        proc.wait(60)
    wait_drained(redis_url)
    return results, published


def wait_drained(redis_url: str, timeout: float = 120.0) -> None:
    """Wait until ingest has read and acked everything in the stream: on a loaded machine it
    can lag a rep behind, and the next rep's viewers would then only see the last one's points."""
    import redis

    from workers.protocol import TELEMETRY_STREAM

    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            added = int(client.xinfo_stream(TELEMETRY_STREAM)["entries-added"])
            groups = client.xinfo_groups(TELEMETRY_STREAM)
            if all(int(g["entries-read"] or 0) >= added and not int(g["pending"]) for g in groups):
                return
            time.sleep(0.2)
        print(f"ingest still behind after {timeout:.0f}s; the next rep starts anyway", flush=True)
    finally:
        client.close()


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


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    out = {}
    for name, pid in pids.items():
        try:
            times = psutil.Process(pid).cpu_times()
            out[name] = times.user + times.system
        except psutil.Error:
            out[name] = float("nan")
    return out


def fanout_rep(
    job_id: int, watched: dict[str, int], workdir: Path, logs: Path, procs: Processes, common: dict[str, Any]
) -> dict[str, Any]:
    """One fan-out run: FANOUT_CLIENTS viewers of one job for FANOUT_SECONDS."""
    before = cpu_seconds(watched)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    many, published = live_phase(
        job_id, FANOUT_CLIENTS, FANOUT_SECONDS, procs=procs, logs=logs, workdir=workdir, **common
    )
    wall = time.monotonic() - started
    used = {k: round(v - before[k], 1) for k, v in cpu_seconds(watched).items()}
    all_lat = [x * 1000 for r in many for x in r["latencies"]]
    hops = [x * 1000 for r in many for x in r["hops"]]
    failed = [r["error"] for r in many if r["error"]]
    if failed:
        print(f"fanout: {len(failed)} clients failed, e.g. {failed[0]}", flush=True)
    return {
        "clients": sum(1 for r in many if r["frames"] > 0),
        "fanout_p50_ms": round(percentile(all_lat, 50), 1),
        "fanout_p95_ms": round(percentile(all_lat, 95), 1),
        "fanout_published_p95_ms": round(percentile([x * 1000 for x in published], 95), 1),
        "fanout_hop_p95_ms": round(percentile(hops, 95), 1),
        "gaps": sum(r["gaps"] for r in many),
        "failed": len(failed),
        "frames_per_client": round(statistics.median(r["frames"] for r in many)),
        "cpu_s": used,
        "wall_s": round(wall),
        "load_1m": round((load_before + os.getloadavg()[0]) / 2, 1),
    }


def live_phases(
    phases: set[str],
    figures: dict[str, Any],
    *,
    cookie: str,
    redis_url: str,
    env: dict[str, str],
    procs: Processes,
    tmp: Path,
    frame_interval: float | None,
    reps: int,
) -> None:
    """Latency with one client, then fan-out to FANOUT_CLIENTS, through daphne and ingest."""
    from console.jobs.models import Job

    logs = tmp / "logs"
    ws_port = free_port()
    daphne = str(Path(sys.executable).parent / "daphne")
    daphne_proc = procs.start(
        [daphne, "-b", "127.0.0.1", "-p", str(ws_port), "console.asgi:application"], env, logs / "daphne.log"
    )
    ingest_args = [sys.executable, "manage.py", "ingest", "--consumer", "bench-live"]
    if frame_interval is not None:
        ingest_args += ["--frame-interval", str(frame_interval)]
    ingest_proc = procs.start(ingest_args, env, logs / "ingest-live.log")
    watched = {"daphne": daphne_proc.pid, "ingest": ingest_proc.pid, "bench clients": os.getpid()}
    wait_port(ws_port)
    common: dict[str, Any] = {"cookie": cookie, "ws_port": ws_port, "redis_url": redis_url, "env": env}

    if "latency" in phases:
        p50s, p95s = [], []
        for rep in range(reps):
            job = Job.objects.create(name="latency-bench", workload="mlp", round_number=1)
            (tmp / f"latency-{rep}").mkdir()
            (single,), _ = live_phase(
                job.pk, 1, LATENCY_SECONDS, procs=procs, logs=logs, workdir=tmp / f"latency-{rep}", **common
            )
            lat = [x * 1000 for x in single["latencies"]]
            p50s.append(percentile(lat, 50))
            p95s.append(percentile(lat, 95))
            print(
                f"latency rep {rep + 1}/{reps}: p50 {p50s[-1]:.1f} ms p95 {p95s[-1]:.1f} ms "
                f"({len(lat)} points, {single['frames']} frames, 1-min load {os.getloadavg()[0]:.1f})"
                + (f"; client failed: {single['error']}" if single["error"] else ""),
                flush=True,
            )
        p50s, p95s = [v for v in p50s if v == v], [v for v in p95s if v == v]  # reps with points
        if p95s:
            figures["latency_p50_ms"] = round(statistics.median(p50s), 1)
            figures["latency_p95_ms"] = round(statistics.median(p95s), 1)
            figures["latency_p95_ms_range"] = [round(min(p95s), 1), round(max(p95s), 1)]

    if "fanout" in phases:
        reports = []
        for rep in range(reps):
            job = Job.objects.create(name="fanout-bench", workload="mlp", round_number=1)
            (tmp / f"fanout-{rep}").mkdir()
            reports.append(fanout_rep(job.pk, watched, tmp / f"fanout-{rep}", logs, procs, common))
            print(
                f"fanout rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v}" for k, v in reports[-1].items()),
                flush=True,
            )
        for key in ("fanout_p50_ms", "fanout_p95_ms", "fanout_published_p95_ms", "fanout_hop_p95_ms"):
            values = [r[key] for r in reports if r[key] == r[key]]  # reps that measured something
            if values:
                figures[key] = round(statistics.median(values), 1)
                figures[f"{key}_range"] = [round(min(values), 1), round(max(values), 1)]
        figures["fanout_clients"] = min(r["clients"] for r in reports)
        figures["fanout_gaps"] = sum(r["gaps"] for r in reports)
        figures["fanout_failed_clients"] = sum(r["failed"] for r in reports)
        figures["fanout_frames_per_client"] = round(
            statistics.median(r["frames_per_client"] for r in reports)
        )
        figures["fanout_load_avg_1m"] = round(statistics.median(r["load_1m"] for r in reports), 1)
    procs.stop_all()


# --- main ------------------------------------------------------------------------------------
def took(figures: dict[str, Any], phase: str, started: float) -> None:
    seconds = round(time.monotonic() - started)
    figures.setdefault("phase_seconds", {})[phase] = seconds
    print(f"{phase} phase took {seconds} s", flush=True)


def main(phases: set[str], frame_interval: float | None, reps: int, keep_logs: bool) -> None:
    import psycopg

    bench_started = time.monotonic()
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    database_url = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"
    os.environ.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="console.settings",
        LOG_LEVEL="WARNING",
    )
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {BENCH_DB}")

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connections

    from console.jobs.models import Job
    from console.telemetry.testing import RedisServer, session_cookie

    tmp = Path(tempfile.mkdtemp(prefix="telemetry-bench-"))
    logs = tmp / "logs"
    logs.mkdir()
    redis_server = RedisServer(tmp / "redis", appendonly=False, port=redis_port)
    procs = Processes()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    figures: dict[str, Any] = {}
    try:
        redis_server.start()
        assert redis_server.proc is not None
        children.adopt(redis_server.proc)
        call_command("migrate", verbosity=0)
        user = User.objects.create_user("bench", password="bench-pw-1")
        cookie = session_cookie(user)

        if "ingest" in phases:
            phase_started = time.monotonic()
            rate_job = Job.objects.create(name="rate-bench", workload="mlp", round_number=1)
            figures.update(rate_phase(rate_job.pk, reps, database_url, redis_url, env, procs, logs))
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
                redis_url=redis_url,
                env=env,
                procs=procs,
                tmp=tmp,
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
    finally:
        procs.stop_all()
        redis_server.stop()
        connections.close_all()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        if keep_logs:
            print(f"logs kept in {logs}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

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
    keys = [
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
    figures["reps"] = reps
    figures["total_seconds"] = round(time.monotonic() - bench_started)
    # NaN (a phase that measured nothing) is not JSON: null instead.
    print(json.dumps({k: None if figures.get(k) != figures.get(k) else figures.get(k) for k in keys}))


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
        with children.stopped_on_exit():
            main(set(args.phases.split(",")), args.frame_interval, args.reps, args.keep_logs)
