"""Hang detection's margin: how long past a job's hang threshold ``job.hang`` comes with every
rank's stack (``hang_detect_margin_s``, the worst case; the issue's bound is 5 s).

A controller and two agents (bench/harness.py); each case is a 2 x 1 gloo DDP job
(bench/ops/hang_script.py), plain or with the SDK's step, with ``hang: {timeout_s: T, action:
fail}``. Once it trains, rank 1 is made to hang: frozen with SIGSTOP, or stopped in a sleep before
a step while rank 0 waits for it in the step's all-reduce (a rank blocked in a collective). The
margin is (the later of the event and the last rank's stack stored) - (the fault + T); for an SDK
script the stall counts from its last step, before the fault, so its margin is if anything
overstated. ``measure(reps)`` returns the figures; run alone it prints a table and the JSON line:

    .venv/bin/python bench/ops/hang.py [--reps 5] [--timeout 4]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.elastic.common import script_pids  # noqa: E402

SCRIPT = REPO / "bench" / "ops" / "hang_script.py"
CASES = (("plain", "sigstop"), ("plain", "collective"), ("sdk", "sigstop"), ("sdk", "collective"))
HANG_AT_STEP = 30  # the collective case: rank 1 stops before this step (about 2 s of training)
KEYS = ("hang_detect_margin_s",)


def run_case(bench: harness.Bench, api: Any, script: str, fault: str, timeout_s: float, index: int) -> float:
    from console.jobs.hang_models import Hang
    from console.jobs.models import Job
    from console.telemetry.models import Event

    progress = bench.root / f"progress-{index}.jsonl"
    args = ["--progress", str(progress)] + (["--sdk"] if script == "sdk" else [])
    if fault == "collective":
        args += ["--hang-at-step", str(HANG_AT_STEP), "--hang-rank", "1"]
    body = {
        "name": f"hang-{script}-{fault}",
        "entrypoint": str(SCRIPT),
        "workdir": str(REPO),
        "args": args,
        "nnodes": "2",
        "nproc_per_node": 1,
        "max_restarts": 0,
        "grace_period": 2,
        "hang": {"timeout_s": timeout_s, "action": "fail"},
    }
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    faulted_at = _fault(bench, progress, fault)
    deadline = time.monotonic() + timeout_s + 60
    while time.monotonic() < deadline:
        event = Event.objects.filter(job_id=job_id, kind="job.hang").first()
        if event is not None:
            hang = Hang.objects.get(pk=event.data["hang"])
            times = [event.created_at.timestamp()] + [s.collected_at.timestamp() for s in hang.stacks.all()]
            if hang.stacks.exclude(threads=[]).count() < 2:
                raise RuntimeError(f"job {job_id}: job.hang without every rank's stack: {event.message}")
            _wait_ended(Job, job_id)
            return max(times) - (faulted_at + timeout_s)
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} ({script}, {fault}): no job.hang within {timeout_s + 60:.0f} s")


def _fault(bench: harness.Bench, progress: Path, fault: str) -> float:
    """Waits for training, then makes rank 1 hang; returns when (unix time)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = progress.read_text().splitlines() if progress.exists() else []
        if fault == "sigstop" and len(lines) >= 20:
            agent = next(a for a in bench.console.agents.agents if a.name == "hang-b")
            pids = script_pids(agent.popen.pid, SCRIPT)
            if pids:
                os.kill(pids[0], signal.SIGSTOP)
                return time.time()
        if fault == "collective" and len(lines) >= HANG_AT_STEP - 1:
            import json

            return float(json.loads(lines[HANG_AT_STEP - 2])["t"])  # the last step rank 1 took
        time.sleep(0.05)
    raise RuntimeError("the job did not train")


def _wait_ended(job_model: Any, job_id: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if job_model.objects.get(pk=job_id).job_state.is_terminal:
            return
        time.sleep(0.2)


def measure(reps: int = 5, timeout_s: float = 4.0, keep: Path | None = None) -> dict[str, Any]:
    """``reps`` of each case; the margins by case and the worst (``hang_detect_margin_s``).
    ``keep``: a directory to keep the processes' logs in."""
    env = {
        "TRAINYARD_HEARTBEAT_INTERVAL": "1.0",
        # The API is called in-process through DRF's test client, which names this host.
        "ALLOWED_HOSTS": "localhost,127.0.0.1,testserver",
        # Its controller and agents share one opted-in node token (a single-machine set-up).
        "TRAINYARD_NODE_TOKEN": os.environ.get("TRAINYARD_NODE_TOKEN") or secrets.token_urlsafe(32),
    }
    with harness.Bench("hang", database="ty_hang_bench", redis="private", env=env, root=keep) as bench:
        from django.contrib.auth.models import User
        from rest_framework.test import APIClient

        api = APIClient()
        api.force_authenticate(User.objects.get_or_create(username="bench", is_superuser=True)[0])
        bench.console.start_controller(TRAINYARD_CONTROLLER_TICK="0.5")
        for name in ("hang-a", "hang-b"):
            bench.console.agents.start(name, heartbeat=1.0)
        _wait_online(2)
        margins: dict[str, list[float]] = {f"{s}/{f}": [] for s, f in CASES}
        index = 0
        for _ in range(reps):
            for script, fault in CASES:
                index += 1
                margins[f"{script}/{fault}"].append(run_case(bench, api, script, fault, timeout_s, index))
    every = [m for values in margins.values() for m in values]
    return {
        "hang_detect_margin_s": round(max(every), 2),
        "timeout_s": timeout_s,
        "reps": reps,
        "cases": {
            case: {
                "median_s": round(statistics.median(v), 2),
                "min_s": round(min(v), 2),
                "max_s": round(max(v), 2),
            }
            for case, v in margins.items()
        },
    }


def _wait_online(count: int) -> None:
    from console.cluster.models import Node

    deadline = time.monotonic() + 120
    while Node.objects.filter(state="ONLINE").count() < count:
        if time.monotonic() > deadline:
            raise RuntimeError("agents did not register")
        time.sleep(0.2)


def print_table(figures: dict[str, Any]) -> None:
    print(f"hang threshold {figures['timeout_s']} s, {figures['reps']} reps per case; load {os.getloadavg()}")
    print(f"{'case':<20} {'median s':>9} {'min s':>7} {'max s':>7}   (margin past the threshold)")
    for case, row in figures["cases"].items():
        print(f"{case:<20} {row['median_s']:>9.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=4.0, help="the jobs' hang timeout_s")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs in this directory")
    args = parser.parse_args(argv)
    figures = measure(args.reps, args.timeout, args.keep)
    print_table(figures)
    harness.print_json(figures, KEYS)


if __name__ == "__main__":
    harness.run(main)
