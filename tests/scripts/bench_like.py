"""A runner shaped like a bench, for tests/test_processes_stop.py.

It starts what a bench starts, through tests/support/procs.py: a "controller", three "agents"
that each start a "rank" in a session of their own (as the real agent does, so no group signal
reaches it) and one process that ignores SIGTERM. Like bench/elastic before its fix, it starts
them outside any ``try``: only the helper can stop them. It prints ``ready`` once all run, then
waits (to be signalled) or, with ``--fail``, raises.

    python tests/scripts/bench_like.py [--fail] [--grace SECONDS]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support import procs  # noqa: E402

SLEEPER = "import time; time.sleep(600)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
# An "agent": its "rank" gets a session of its own, and ignores SIGTERM like a rank stuck in a
# collective; the agent itself exits on SIGTERM without stopping it.
AGENT = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], start_new_session=True); "
    "time.sleep(600)"
)


def start_cluster() -> None:
    procs.spawn([sys.executable, "-c", SLEEPER])
    for _ in range(3):
        procs.spawn([sys.executable, "-c", AGENT])
    procs.spawn([sys.executable, "-c", STUBBORN])


def wait_for_ranks(count: int, timeout: float = 30.0) -> None:
    """Until every agent has started its rank (the test checks those pids too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for popen in procs.running():
            procs.remember_descendants(popen)
        if sum(len(procs.known_descendants(p)) for p in procs.running()) >= count:
            return
        time.sleep(0.05)
    raise RuntimeError("the agents did not start their ranks")


def main(fail: bool) -> None:
    start_cluster()
    wait_for_ranks(3)
    print("ready", flush=True)
    if fail:
        raise RuntimeError("the bench failed")
    time.sleep(600)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args()
    with procs.stopped_on_exit(grace=args.grace):
        main(args.fail)
