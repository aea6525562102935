"""The telemetry bench's live phases: a producer logging through the SDK's writer and shipping
with the agent's shipper, ingest and Daphne in between, and websocket viewers measuring SDK
``log()`` -> browser latency, for one viewer and for FANOUT_CLIENTS (bench/telemetry/run.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import percentile
from tests.support.services import Console

# 10,000 points/s = 2 ranks x 1,000 records/s x 5 values.
LIVE_RATE = 10_000
LIVE_RANKS = 2
LIVE_VALUES = 5
LATENCY_SECONDS = 6.0
FANOUT_CLIENTS = 200
FANOUT_SECONDS = 8.0
WARMUP_SECONDS = 2.0
RAMP_BATCH = 10
RUN = Path(__file__).resolve().parent / "run.py"
# The producer ships as this node, enrolled with this secret in the bench's own database (made and
# dropped by the bench) and allocated the jobs' ranks: ingest believes nothing else.
BENCH_NODE = "bench"
BENCH_NODE_SECRET = "tyn_telemetry-bench-node"


def bench_job(name: str, nproc: int) -> int:
    """A job whose round 1 runs ranks 0 to ``nproc`` - 1 on BENCH_NODE."""
    from console.jobs.models import Job
    from tests.support.telemetry import allocate

    job = Job.objects.create(name=name, workload="mlp", round_number=1)
    allocate(job, node=BENCH_NODE, secret=BENCH_NODE_SECRET, nproc=nproc)
    return job.pk


# --- producer subprocess ---------------------------------------------------------------------
def produce(job_id: int, rate: int, seconds: float, workdir: Path, redis_url: str) -> None:
    """Log ``rate`` points/s through the SDK's own writer (workers.sdk.telemetry.Telemetry: the
    ``log()`` hot path, its flusher thread and its files), one writer per rank, and ship them with
    the agent's real shipper. Each record's ``t_append`` value is the time of its log call."""
    from workers.agent.shipper import TelemetryShipper
    from workers.sdk.telemetry import Telemetry
    from workers.signing import report_key

    shipper = TelemetryShipper(redis_url, BENCH_NODE, report_key(BENCH_NODE_SECRET))
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
    console: Console,
    workdir: Path,
) -> tuple[list[dict[str, Any]], list[float]]:
    producer: list[subprocess.Popen[bytes]] = []

    def start_producer() -> None:
        """Start the producer and return once it produces (run off the clients' event loop)."""
        producer.append(
            console.spawn(
                [
                    sys.executable,
                    str(RUN),
                    "--produce",
                    str(job_id),
                    "--seconds",
                    str(seconds + 1.0),
                    "--workdir",
                    str(workdir),
                    "--redis",
                    redis_url,
                ],
                f"producer-{clients}.log",
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
    job_id: int, watched: dict[str, int], workdir: Path, console: Console, common: dict[str, Any]
) -> dict[str, Any]:
    """One fan-out run: FANOUT_CLIENTS viewers of one job for FANOUT_SECONDS."""
    before = cpu_seconds(watched)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    many, published = live_phase(
        job_id, FANOUT_CLIENTS, FANOUT_SECONDS, console=console, workdir=workdir, **common
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
    console: Console,
    tmp: Path,
    frame_interval: float | None,
    reps: int,
) -> None:
    """Latency with one client, then fan-out to FANOUT_CLIENTS, through daphne and ingest."""
    url = console.start_web()
    ws_port = int(url.rsplit(":", 1)[1])
    ingest_proc = console.start_ingest(
        "bench-live", *(["--frame-interval", str(frame_interval)] if frame_interval is not None else [])
    )
    assert console.web is not None
    watched = {"daphne": console.web.pid, "ingest": ingest_proc.pid, "bench clients": os.getpid()}
    common: dict[str, Any] = {"cookie": cookie, "ws_port": ws_port, "redis_url": redis_url}

    if "latency" in phases:
        p50s, p95s = [], []
        for rep in range(reps):
            job_id = bench_job("latency-bench", LIVE_RANKS)
            (tmp / f"latency-{rep}").mkdir()
            (single,), _ = live_phase(
                job_id, 1, LATENCY_SECONDS, console=console, workdir=tmp / f"latency-{rep}", **common
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
            job_id = bench_job("fanout-bench", LIVE_RANKS)
            (tmp / f"fanout-{rep}").mkdir()
            reports.append(fanout_rep(job_id, watched, tmp / f"fanout-{rep}", console, common))
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
    console.stop()
