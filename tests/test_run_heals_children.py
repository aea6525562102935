"""Under `bin/run`'s supervisor a child that dies is started again while a job trains, and the
rest stay up: SIGKILL of ingest leaves the job's round alone; SIGKILL of the agent (its ranks die
with it) gives the job a new round, which resumes from its checkpoint and succeeds."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.support import procs
from tests.support.up import ConsoleApi, RunningConsole, start_console

REPO = Path(__file__).resolve().parent.parent
DDP_SCRIPT = REPO / "tests" / "scripts" / "ddp_train.py"
LOGIN = re.compile(r"username=(\S+) password=(\S+)")


def progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps(path: Path) -> list[int]:
    return [r["step"] for r in progress(path) if "step" in r]


def wait_steps(path: Path, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(steps(path)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} steps within {timeout:.0f} s"
        time.sleep(0.2)


def kill_child(console: RunningConsole, name: str) -> int:
    """SIGKILLs one child behind the supervisor's back; returns its new pid once restarted."""
    old = console.children[name]
    os.kill(old, signal.SIGKILL)
    console.wait_for(re.compile(rf"{name} \(pid {old}\) exited unexpectedly with signal SIGKILL; restarting"))
    new = int(console.wait_for(re.compile(rf"restarted {name} \(pid (\d+)\)")).group(1))
    assert new != old
    return new


def test_killed_ingest_and_agent_are_restarted_while_a_job_trains(
    tmp_path: Path, consoles: list[RunningConsole]
) -> None:
    # Given a console running a plain DDP job that checkpoints every 5 steps
    console, url = start_console(consoles, tmp_path / "home")
    login = console.seen(LOGIN)
    assert login is not None
    api = ConsoleApi(url, login.group(1), login.group(2))
    api.wait_node_online("local")
    log = tmp_path / "progress.jsonl"
    job_id = api.submit(
        {
            "name": "heal",
            "entrypoint": str(DDP_SCRIPT),
            "workdir": str(DDP_SCRIPT.parent),
            "args": [
                "--steps",
                "150",
                "--step-sleep",
                "0.1",
                "--checkpoint-every",
                "5",
                "--progress",
                str(log),
            ],
            "nnodes": "1",
            "nproc_per_node": 1,
        }
    )
    wait_steps(log, 5)
    first_round = api.job(job_id)["round"]
    others = {name: console.children[name] for name in ("postgres", "redis", "web", "controller")}

    # When ingest is SIGKILLed
    ingest = kill_child(console, "ingest")

    # Then it runs again and the job trains on in the same round
    taken = len(steps(log))
    wait_steps(log, taken + 5)
    assert procs.alive(ingest)
    job = api.job(job_id)
    assert (job["state"], job["round"]) == ("RUNNING", first_round)

    # When the agent is SIGKILLed (its reaper kills its rank)
    checkpointed = max(steps(log)) // 5 * 5
    kill_child(console, "agent")

    # Then the job gets a new round that resumes from a checkpoint and succeeds
    job = api.wait_job(job_id, {"SUCCEEDED"}, timeout=300)
    assert job["round"] > first_round
    resumed = [r["resume_step"] for r in progress(log) if r.get("event") == "start"][1:]
    assert resumed and resumed[0] >= checkpointed - 5
    assert max(steps(log)) == 150

    # And nothing else was restarted; Ctrl-C then leaves no process
    assert {name: console.children[name] for name in others} == others
    assert console.interrupt() == 0
    assert console.leftovers() == []
