"""The supervisor behind `bin/run` restarts a child that dies, with a growing delay, gives up on
one that keeps crashing, and stops children in reverse start order leaving no process.

Decisions are checked in-process (CrashPolicy); the restarts on real, short-lived processes."""

from __future__ import annotations

import signal
import sys
import time
from io import StringIO
from pathlib import Path

import psutil
import pytest

from console.core.supervisor import ChildSpec, CrashPolicy, GaveUp, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]
# Leaves a worker in its group, as Celery or PostgreSQL do.
FORKER = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
    " time.sleep(600)",
]
FAST = CrashPolicy(limit=3, window=30.0, first_delay=0.2, max_delay=1.0)


def test_delay_doubles_with_recent_crashes_and_gives_up_at_the_limit() -> None:
    policy = CrashPolicy(limit=5, window=60.0, first_delay=1.0, max_delay=15.0)
    crashes: list[float] = []
    delays = []
    for now in (100.0, 101.0, 103.0, 107.0, 115.0):
        crashes.append(now)
        delays.append(policy.delay(crashes, now))
    assert delays == [1.0, 2.0, 4.0, 8.0, None]


def test_crashes_outside_the_window_are_forgotten() -> None:
    policy = CrashPolicy(limit=3, window=60.0, first_delay=1.0, max_delay=15.0)
    # Two crashes long ago and one now: a first crash again, not a third.
    assert policy.delay([0.0, 10.0, 500.0], 500.0) == 1.0
    assert policy.delay([480.0, 490.0, 500.0], 500.0) is None


def test_delay_is_capped() -> None:
    policy = CrashPolicy(limit=100, window=1000.0, first_delay=1.0, max_delay=15.0)
    assert policy.delay([float(t) for t in range(10)], 10.0) == 15.0


def run_checks(sup: Supervisor, seconds: float, until: object = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sup.check()
        if until is not None and callable(until) and until():
            return
        time.sleep(0.05)


def test_a_killed_child_is_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    # Given two running children
    out = StringIO()
    sup = Supervisor(out, {}, tmp_path, FAST)
    try:
        first = sup.start(ChildSpec("first", SLEEPER))
        second = sup.start(ChildSpec("second", FORKER))
        run_checks(sup, 1.0, until=lambda: len(psutil.Process(second.pid).children()) == 1)
        old_pid, other_pid = second.pid, first.pid
        assert old_pid is not None
        worker = psutil.Process(old_pid).children()[0]

        # When one is SIGKILLed
        psutil.Process(old_pid).kill()
        run_checks(sup, 5.0, until=lambda: second.running() and second.pid != old_pid)

        # Then it runs again under a new pid, its old worker is gone, the other was left alone
        assert second.running() and second.pid != old_pid
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        assert first.running() and first.pid == other_pid
        assert f"second (pid {old_pid}) exited unexpectedly with signal SIGKILL" in out.getvalue()
        assert f"restarted second (pid {second.pid})" in out.getvalue()
    finally:
        sup.stop_all()


def test_a_child_that_keeps_crashing_makes_it_give_up(tmp_path: Path) -> None:
    # Given a child that exits as soon as it starts
    out = StringIO()
    sup = Supervisor(out, {}, tmp_path, FAST)
    try:
        sup.start(ChildSpec("crasher", CRASHER))

        # When the supervisor watches it
        with pytest.raises(GaveUp, match=r"crasher \(pid \d+\) exited with code 3: 3 crashes within 30 s"):
            run_checks(sup, 20.0)

        # Then it was restarted twice, with a growing delay, before giving up
        text = out.getvalue()
        assert text.count("restarting it in") == 2
        assert text.count("restarted crasher") == 2
    finally:
        sup.stop_all()


def test_stop_all_goes_in_reverse_start_order_with_each_childs_signal(tmp_path: Path) -> None:
    # Given three children, the first stopped by SIGINT (as PostgreSQL is), one with a worker
    out = StringIO()
    sup = Supervisor(out, {}, tmp_path, FAST)
    database = sup.start(ChildSpec("database", SLEEPER, stop_signal=signal.SIGINT))
    web = sup.start(ChildSpec("web", FORKER))
    agent = sup.start(ChildSpec("agent", SLEEPER))
    run_checks(sup, 2.0, until=lambda: len(psutil.Process(web.pid).children()) == 1)
    started = [psutil.Process(c.pid) for c in (database, web, agent)] + psutil.Process(web.pid).children()

    # When everything is stopped
    sup.stopping = True
    sup.stop_all()

    # Then the last started went first, the database last, and no process is left
    lines = [line for line in out.getvalue().splitlines() if "stopping" in line]
    assert [line.split()[2] for line in lines] == ["agent", "web", "database"]
    assert database.process is not None and database.process.returncode == -signal.SIGINT
    assert [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
