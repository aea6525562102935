"""What the elastic bench's cases share: the scripts, their per-step logs, and finding their
rank processes (bench/elastic/run.py)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT = 2.0
STEP_SLEEP = 0.05
TRAINED_STEPS = 25
"""Each case acts once the job has trained this many steps at its world size (about 2 s), on
Trainyard and torchrun alike: a failure or resize comes while a job trains, not in its first
second."""
TORCHRUN_WAIT = 15.0
"""How long a torchrun case may take before it counts as "never"."""
DDP_SCRIPT = REPO / "tests" / "scripts" / "plain_ddp.py"
SDK_SCRIPT = REPO / "tests" / "scripts" / "elastic_count.py"


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def first_step_after(path: Path, t0: float, world: int | None = None, timeout: float = 60.0) -> float | None:
    """Seconds from ``t0`` to the first step logged by a process started after ``t0``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = False
        for record in read_progress(path):
            if (
                record.get("event") == "start"
                and record["t"] > t0
                and (world is None or record["world"] == world)
            ):
                started = True
            elif started and "step" in record and "event" not in record and record["t"] > t0:
                return float(record["t"] - t0)
        time.sleep(0.05)
    return None


def wait_steps(path: Path, world: int, count: int, timeout: float = 45.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = (r for r in read_progress(path) if "step" in r and "event" not in r)
        if sum(1 for r in steps if r["world"] == world) >= count:
            return True
        time.sleep(0.1)
    return False


def ddp_args(progress: Path, steps: int = 100000) -> list[str]:
    return [
        "--steps",
        str(steps),
        "--step-sleep",
        str(STEP_SLEEP),
        "--checkpoint-every",
        "5",
        "--step-log",
        str(progress),
    ]


def wait_records(record: Path, world: int, count: int, timeout: float = 45.0) -> bool:
    """elastic_count.py's record: ``count`` steps of rank 0 at ``world``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = read_progress(record)
        if sum(1 for r in lines if r.get("world") == world and r.get("rank") == 0) >= count:
            return True
        time.sleep(0.1)
    return False


def first_record_after(
    record: Path, t0: float, world: int, round_above: int = 0, timeout: float = 60.0
) -> float | None:
    """Seconds from ``t0`` to the first step elastic_count.py recorded at ``world`` after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in read_progress(record):
            if r.get("world") == world and r.get("round", 0) > round_above and r.get("t", 0) > t0:
                return float(r["t"] - t0)
        time.sleep(0.05)
    return None


def script_pids(root_pid: int, script: Path = DDP_SCRIPT) -> list[int]:
    """The rank processes running ``script`` under ``root_pid``, not their own children (a
    DataLoader worker carries its rank's command line)."""
    import psutil

    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return []
    found: dict[int, int] = {}  # pid -> parent pid
    for child in children:
        with contextlib.suppress(psutil.Error):
            if any(script.name in part for part in child.cmdline()) and "torchrun" not in " ".join(
                child.cmdline()[:2]
            ):
                found[child.pid] = child.ppid()
    return [pid for pid, parent in found.items() if parent not in found]
