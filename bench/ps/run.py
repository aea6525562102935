"""Parameter-server throughput and latency: recsys-embedding in PS, hybrid and allreduce modes.

    .venv/bin/python bench/ps/run.py [--rows 10000000] [--dim 64] [--windows 5] [--window-s 8]

- PS (asynchronous) and hybrid: 2 workers, 2 PS and a coordinator on this host (workers/ps/local.py;
  later the console starts them), a table of ``--rows`` x ``--dim`` (two such tables: users and items,
  lazily initialised). Throughput: examples completed per second at the coordinator over
  ``--windows`` consecutive windows of ``--window-s`` seconds after a warm-up; median and range.
- allreduce: the same workload under 2 DDP ranks (gloo, sparse gradients, SparseAdam). Each rank
  holds every table with its Adam state (3 x 4 bytes x rows x dim per table), so 10M x 64 would need
  ~15 GB per rank: it runs at ``--allreduce-rows`` (default 1M), the largest that fits here twice.
- pull / push latency: a probe client pulls and pushes 1,000 x 64 float32 rows (a probe table, lr 0)
  on the asynchronous PS after training, its workers stopped: p50 / p99 per repetition of 100
  calls, median of 5 (the workers' own latencies under load are in their ``worker_*`` telemetry).
- worker join: a third worker started while the PS job trains, timed from its spawn to its first
  push (its ``ps_first_push`` telemetry event); repeated, median. ``--console`` measures only this,
  through a real console: the REST resize of the worker role to the new worker's first push
  (bench/ps/console.py).

Ends with one JSON line: ps_examples_per_s, hybrid_examples_per_s, allreduce_examples_per_s,
pull_p99_ms, push_p99_ms, worker_join_s. Every process it starts is stopped on exit, SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench import harness  # noqa: E402
from tests.support import procs  # noqa: E402
from workers.net import free_port  # noqa: E402
from workers.ps.contract import Mode  # noqa: E402
from workers.ps.local import LocalPsJob  # noqa: E402
from workers.ps.optim import OptimizerConfig  # noqa: E402
from workers.ps.store import TableConfig  # noqa: E402

BATCH = 512
WORKERS = 2
PROBE_ROWS = 1000
PROBE_CALLS = 100


def settings(rows: int, dim: int) -> list[str]:
    values = {
        "rows": rows,
        "dim": dim,
        "batch_size": BATCH,
        "steps": 1_000_000,
        "examples": 1_000_000_000,
        "shard_batches": 2,
        "eval_samples": 64,
        "log_every": 20,
        "checkpoint_every": 0,
        "watch_every": 1_000_000,
    }
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def examples_done(job: LocalPsJob) -> int:
    return int(job.coordinator_client().queue()["examples_done"])


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def throughput(job: LocalPsJob, windows: int, window_s: float) -> list[float]:
    wait_until(lambda: examples_done(job) > 4 * BATCH * WORKERS, 300, "first shards done")
    rates = []
    for _ in range(windows):
        before, started = examples_done(job), time.monotonic()
        time.sleep(window_s)
        rates.append((examples_done(job) - before) / (time.monotonic() - started))
    return rates


def start_workers(job: LocalPsJob, argv: list[str], hybrid: bool) -> None:
    port = free_port()
    for index in range(WORKERS):
        extra = {"TRAINYARD_STRATEGY": "parameter_server"}
        if hybrid:
            extra.update(
                RANK=str(index),
                LOCAL_RANK=str(index),
                WORLD_SIZE=str(WORKERS),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        job.start_worker(index, argv, worker_count=WORKERS, **extra)


def probe_latency(job: LocalPsJob, dim: int) -> tuple[list[float], list[float]]:
    """Per repetition: (pull p50, pull p99) and (push p50, push p99) in ms, 1,000 x dim rows."""
    client = job.client("bench-probe")
    client.declare([TableConfig("probe", dim, 0.01, OptimizerConfig("sgd", lr=0.0))])
    pulls, pushes = [], []
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        pull_ms, push_ms = [], []
        for _ in range(PROBE_CALLS):
            ids = torch.randint(0, 10_000_000, (PROBE_ROWS,), generator=generator).unique()
            started = time.perf_counter()
            client.pull({"probe": ids})
            pull_ms.append((time.perf_counter() - started) * 1000)
            grads = torch.randn(ids.numel(), dim)
            started = time.perf_counter()
            client.push(None, {"probe": (ids, grads)}, {}, {}, ids.numel())
            push_ms.append((time.perf_counter() - started) * 1000)
        pulls.append(sorted(pull_ms))
        pushes.append(sorted(push_ms))
    client.close()

    def pick(samples: list[list[float]], fraction: float) -> list[float]:
        return [s[min(len(s) - 1, int(fraction * len(s)))] for s in samples]

    return pick(pulls, 0.5) + pick(pulls, 0.99), pick(pushes, 0.5) + pick(pushes, 0.99)


def worker_joins(job: LocalPsJob, argv: list[str], times: int) -> list[float]:
    joins = []
    for attempt in range(times):
        index = WORKERS + attempt
        telemetry = job.workdir / f"telemetry-worker-{index}.jsonl"
        spawned = time.time()
        job.start_worker(index, argv, worker_count=WORKERS, TRAINYARD_STRATEGY="parameter_server")

        def first_push(path: Path = telemetry) -> float | None:
            if not path.exists():
                return None
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record.get("event") == "ps_first_push":
                    return float(record["data"]["at"])
            return None

        wait_until(lambda: first_push() is not None, 120, "a joining worker's first push")
        joins.append(float(first_push() or 0) - spawned)
        job.kill(f"worker-{index}", signal.SIGTERM)
        job.processes[f"worker-{index}"].wait(60)
    return joins


def allreduce(workdir: Path, rows: int, dim: int, windows: int, window_s: float) -> list[float]:
    """2 DDP ranks; samples/s (both ranks) from rank 0's StepTimer records."""
    port = free_port()
    telemetry = workdir / "allreduce-0.jsonl"
    processes = []
    try:
        for rank in range(WORKERS):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(WORKERS),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "TRAINYARD_TELEMETRY": str(workdir / f"allreduce-{rank}.jsonl"),
                "TRAINYARD_CHECKPOINT_DIR": str(workdir / "allreduce-checkpoints"),
            }
            processes.append(
                procs.spawn(
                    [sys.executable, "-m", "workers.workloads", "recsys-embedding", *settings(rows, dim)],
                    env=env,
                    log=workdir / f"allreduce-{rank}.log",
                    cwd=REPO,
                )
            )

        def rates() -> list[float]:
            if not telemetry.exists():
                return []
            found = []
            for line in telemetry.read_text().splitlines():
                record = json.loads(line)
                if record.get("kind") == "metric" and "samples_per_s" in record.get("values", {}):
                    found.append(float(record["values"]["samples_per_s"]))
            return found

        # The first record includes start-up; take the windows after it.
        wait_until(
            lambda: len(rates()) >= windows + 2, 60 + windows * window_s * 10, "allreduce throughput records"
        )
        return rates()[2 : 2 + windows]
    finally:
        for process in processes:
            procs.kill(process)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--allreduce-rows", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--joins", type=int, default=5)
    parser.add_argument(
        "--console",
        action="store_true",
        help="only worker_join_s through a real console (bench/ps/console.py): REST resize to first push",
    )
    args = parser.parse_args()
    if args.console:
        return console_joins(args.joins)
    # The probe client runs here: one thread, like the workers (OMP_NUM_THREADS=1), so its numbers
    # do not include torch's intra-op threads waiting for a core on a busy machine.
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    jobs: list[LocalPsJob] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-ps-") as scratch:
        try:
            workdir = Path(scratch)
            argv = ["-m", "workers.workloads", "recsys-embedding", *settings(args.rows, args.dim)]
            for mode in (Mode.ASYNC, Mode.HYBRID):
                job = LocalPsJob(workdir / mode.value, ps_count=2, mode=mode, lease_s=10.0, stats_every_s=5.0)
                jobs.append(job)
                job.start_servers()
                start_workers(job, argv, hybrid=mode is Mode.HYBRID)
                results[f"{mode.value}_rates"] = throughput(job, args.windows, args.window_s)
                print(f"{mode.value}: {summary(results[f'{mode.value}_rates'])}", flush=True)
                if mode is Mode.ASYNC:
                    results["joins"] = worker_joins(job, argv, args.joins)
                    print(f"worker joins: {summary(results['joins'])}", flush=True)
                    stats = job.client().stats()
                    results["ps_rows"] = [s["rows"] for s in stats]
                    results["ps_rss_mb"] = [s["rss_bytes"] >> 20 for s in stats]
                    # Latency on the PS as training left it, without the workers competing for the
                    # two cores (the workers' own p99 under load is in their worker_* telemetry).
                    for index in range(WORKERS):
                        job.kill(f"worker-{index}", signal.SIGTERM)
                    for index in range(WORKERS):
                        job.processes[f"worker-{index}"].wait(60)
                    results["pull"], results["push"] = probe_latency(job, args.dim)
                job.stop()
            results["allreduce_rates"] = allreduce(
                workdir, args.allreduce_rows, args.dim, args.windows, args.window_s
            )
        finally:
            # Before the scratch directory goes: a PS writes its final checkpoint on SIGTERM.
            for job in jobs:
                job.stop()
    report(results, args, time.monotonic() - started)
    return 0


def console_joins(joins: int) -> int:
    """``--console``: worker_join_s measured through the console, with its own JSON line."""
    from bench.ps.console import TABLE_ROWS, measure

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-ps-console-") as scratch:
        Path(scratch).chmod(0o755)  # PostgreSQL runs as its own user and must reach its directory
        seconds = measure(Path(scratch), joins, log=lambda text: print(text, flush=True))
    join = summary(seconds)
    print()
    print("| measure (through the console) | median | range |")
    print("|---|---|---|")
    print(
        f"| worker join: REST resize to first push, s | {join['median']:.2f} | {join['min']:.2f}-{join['max']:.2f} |"
    )
    print(
        f"({len(seconds)} joins of a recsys worker, {TABLE_ROWS:,} x 16 tables, 2 PS; {time.monotonic() - started:.0f} s)"
    )
    print(
        json.dumps({"worker_join_s": round(join["median"], 2), "through": "console", "joins": len(seconds)})
    )
    return 0


def report(results: dict[str, Any], args: argparse.Namespace, elapsed: float) -> None:
    ps_rate = summary(results["async_rates"])
    hybrid_rate = summary(results["hybrid_rates"])
    allreduce_rate = summary(results["allreduce_rates"])
    n = len(results["pull"]) // 2
    pull_p50, pull_p99 = summary(results["pull"][:n]), summary(results["pull"][n:])
    push_p50, push_p99 = summary(results["push"][:n]), summary(results["push"][n:])
    join = summary(results["joins"])

    def row(name: str, value: dict[str, float], unit: str) -> str:
        return f"{name:<44} {value['median']:>10.1f} {unit:<10} [{value['min']:.1f} .. {value['max']:.1f}] n={value['n']}"

    table = f"{args.rows:,} x {args.dim}"
    print()
    print(f"recsys-embedding, batch {BATCH}, {WORKERS} workers, 2 PS (median [min .. max])")
    print(row(f"PS asynchronous, tables {table}", ps_rate, "examples/s"))
    print(row(f"hybrid (rows on PS, dense DDP), {table}", hybrid_rate, "examples/s"))
    print(row(f"allreduce (DDP), tables {args.allreduce_rows:,} x {args.dim}", allreduce_rate, "examples/s"))
    print(row(f"pull {PROBE_ROWS} x {args.dim} rows p50", pull_p50, "ms"))
    print(row(f"pull {PROBE_ROWS} x {args.dim} rows p99", pull_p99, "ms"))
    print(row(f"push {PROBE_ROWS} x {args.dim} rows p50", push_p50, "ms"))
    print(row(f"push {PROBE_ROWS} x {args.dim} rows p99", push_p99, "ms"))
    print(row("worker spawn -> first push", join, "s"))
    print(f"rows held per PS after the async run: {results['ps_rows']}, RSS MB: {results['ps_rss_mb']}")
    print(
        f"PS / allreduce throughput: {ps_rate['median'] / allreduce_rate['median']:.2f}x; "
        f"hybrid / allreduce: {hybrid_rate['median'] / allreduce_rate['median']:.2f}x; {elapsed:.0f} s in all"
    )
    print(
        json.dumps(
            {
                "ps_examples_per_s": round(ps_rate["median"], 1),
                "hybrid_examples_per_s": round(hybrid_rate["median"], 1),
                "allreduce_examples_per_s": round(allreduce_rate["median"], 1),
                "pull_p99_ms": round(pull_p99["median"], 2),
                "push_p99_ms": round(push_p99["median"], 2),
                "worker_join_s": round(join["median"], 2),
            }
        )
    )


if __name__ == "__main__":
    # SIGINT and SIGTERM unwind main(): every process it started is stopped on the way out.
    sys.exit(harness.run(main))
