"""``worker_join_s`` through the console: a PS job run by a real console (web, controller, ingest,
three agents: bench/chaos/console.py's ComposeConsole on its own PostgreSQL and Redis), its worker
role resized by the REST API, timed from the resize request to the new worker's first push (its
``ps_first_push`` telemetry event, in the rank's telemetry file on the agent's host).

Each repetition resizes the worker role 1 -> 2, waits for the new worker's first push, then resizes
back to 1 and waits until that worker's process is gone, so every join starts from the same state.
The PS and the coordinator run throughout: the round number is checked to stay 1.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from bench.chaos.console import ComposeConsole
from bench.chaos.infra import sweep

TABLE_ROWS = 100_000
DIM = 16


def hyperparameters() -> dict[str, Any]:
    return {
        "rows": TABLE_ROWS,
        "dim": DIM,
        "batch_size": 256,
        "steps": 1_000_000,
        "examples": 1_000_000_000,
        "shard_batches": 2,
        "eval_samples": 64,
        "log_every": 50,
        "checkpoint_every": 0,
        "watch_every": 1_000_000,
    }


def first_pushes(root: Path, job_id: int) -> dict[str, float]:
    """Every worker's first push so far: telemetry file -> unix time."""
    found = {}
    for path in root.glob(f"agents/*/rounds/job-{job_id}/round-*/rank-*/telemetry.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "ps_first_push":
                found[str(path)] = float(record["data"]["at"])
                break
    return found


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def workers_running(run_id: str) -> list[int]:
    """The pids of this run's PS worker processes (role in their environment)."""
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("TRAINYARD_PS_ROLE") == "worker" and env.get("BENCH_RUN") == run_id:
            pids.append(proc.pid)
    return pids


def measure(root: Path, joins: int, log: Any = print) -> list[float]:
    """Runs the console, the job and ``joins`` resizes; returns each join's seconds."""
    run_id = uuid.uuid4().hex[:12]
    console = ComposeConsole(root, run_id)
    try:
        started = time.monotonic()
        console.start()
        log(f"console: up in {time.monotonic() - started:.0f} s")
        body = {
            "name": "bench-ps-join",
            "workload": "recsys-embedding",
            "strategy": "parameter_server",
            "roles": {"ps": {"count": 2}, "worker": {"count": 1, "min": 1, "max": 4}},
            "nnodes": str(len(console.agent_names)),
            "hyperparameters": hyperparameters(),
            "env": {"BENCH_RUN": run_id, "TRAINYARD_PS_LEASE_S": "5"},
            "grace_period": 5,
        }
        response = console.http("post", "/api/v1/jobs/", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"submission failed: {response.status_code} {response.text[:500]}")
        job_id = int(response.json()["id"])
        wait(lambda: first_pushes(root, job_id), 300, "the first worker's first push")
        log("console: the PS job trains")
        seconds = []
        for attempt in range(joins):
            before = set(first_pushes(root, job_id))
            asked = time.time()
            response = console.http(
                "post", f"/api/v1/jobs/{job_id}/resize/", json={"role": "worker", "count": 2}
            )
            if response.status_code != 200:
                raise RuntimeError(f"resize failed: {response.status_code} {response.text[:500]}")
            new = wait(
                lambda before=before: set(first_pushes(root, job_id)) - before,  # type: ignore[misc]
                120,
                "the new worker's first push",
            )
            seconds.append(first_pushes(root, job_id)[new.pop()] - asked)
            console.http("post", f"/api/v1/jobs/{job_id}/resize/", json={"role": "worker", "count": 1})
            wait(lambda: len(workers_running(run_id)) == 1, 60, "the removed worker to stop")
            state, number = console.job_state(job_id)
            if number != 1:
                raise RuntimeError(f"the job moved to round {number} ({state}): the PS were restarted")
            log(f"console: join {attempt + 1}: {seconds[-1]:.2f} s (round {number}, {state})")
        console.stop_job(job_id)
        return seconds
    finally:
        console.close()
        sweep(run_id)  # anything of the run still alive (the processes carry its mark)
