"""Benches and test fixtures stop every process they started, by pid: on SIGTERM, on Ctrl-C, on a
failure, and when a second signal arrives while they are stopping (tests/support/procs.py)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.procs import alive

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tests" / "scripts" / "bench_like.py"
HARNESS_RUNNER = REPO / "tests" / "scripts" / "harness_like.py"
FIXTURE_TEST = REPO / "tests" / "scripts" / "fixture_like.py"


def descendants(pid: int) -> dict[int, float]:
    return {p.pid: p.create_time() for p in psutil.Process(pid).children(recursive=True)}


def start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def wait_ready(runner: subprocess.Popen[str], marker: str, timeout: float = 60.0) -> None:
    """Until the runner prints ``marker`` (read in a thread: a silent runner cannot hang us)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert runner.stdout is not None
        for line in iter(runner.stdout.readline, ""):
            lines.put(line)
            if marker in line:
                return

    threading.Thread(target=pump, daemon=True).start()
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            if runner.poll() is not None:
                break
            continue
        if marker in seen[-1]:
            return
    raise AssertionError(f"no {marker!r} within {timeout} s; output:\n{''.join(seen)}")


def survivors(started: dict[int, float], timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, created in started.items() if alive(pid, created)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]])
def test_a_signalled_bench_leaves_no_process(signals: list[signal.Signals]) -> None:
    # Given a bench-like runner with a controller, three agents with a rank each (in sessions
    # of their own) and a process that ignores SIGTERM
    runner = start([sys.executable, str(RUNNER), "--grace", "2"])
    wait_ready(runner, "ready")
    started = descendants(runner.pid)
    try:
        assert len(started) == 8

        # When it is signalled (a second SIGTERM arriving while it waits out the grace period)
        for sig in signals:
            runner.send_signal(sig)
            time.sleep(0.5)

        # Then it exits as after Ctrl-C, and nothing it started survives it
        assert runner.wait(timeout=60) == 130
        assert survivors(started) == []
    finally:
        kill_leftovers(survivors(started, timeout=0))
        if runner.poll() is None:
            runner.kill()


def test_a_signalled_harness_bench_stops_its_console_and_drops_its_database() -> None:
    # Given a bench on bench/harness.py: its database, a private Redis, Daphne, and an agent-like
    # process whose rank runs in a session of its own
    database = f"ty_harness_test_{os.getpid()}"
    runner = start([sys.executable, str(HARNESS_RUNNER), database])
    wait_ready(runner, "ready", timeout=120)
    started = descendants(runner.pid)
    try:
        assert len(started) >= 4  # redis-server, daphne, the agent and its rank
        assert database_exists(database)

        # When it gets SIGTERM
        runner.send_signal(signal.SIGTERM)

        # Then it exits as after Ctrl-C, nothing it started survives it, its database is gone
        assert runner.wait(timeout=90) == 130
        assert survivors(started) == []
        assert not database_exists(database)
    finally:
        kill_leftovers(survivors(started, timeout=0))
        if runner.poll() is None:
            runner.kill()


def database_exists(name: str) -> bool:
    import psycopg

    from bench.harness import PG_ADMIN_URL

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def test_a_failed_bench_leaves_no_process() -> None:
    # Given a bench-like runner that fails once its processes run
    runner = start([sys.executable, str(RUNNER), "--fail", "--grace", "2"])
    wait_ready(runner, "ready")
    started = descendants(runner.pid)
    try:
        # When it raises
        assert runner.wait(timeout=60) != 0
        output = runner.stdout.read() if runner.stdout else ""
        assert "RuntimeError: the bench failed" in output

        # Then nothing it started survives it
        assert survivors(started) == []
    finally:
        kill_leftovers(survivors(started, timeout=0))


def test_pytest_sigtermed_mid_test_tears_its_fixtures_down() -> None:
    # Given pytest running a test whose fixture started an agent-like process with a rank
    pytest_run = start(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(FIXTURE_TEST)]
    )
    wait_ready(pytest_run, "fixture ready", timeout=120)
    started = descendants(pytest_run.pid)
    try:
        assert len(started) == 2

        # When pytest gets SIGTERM in the middle of the test
        pytest_run.send_signal(signal.SIGTERM)
        pytest_run.wait(timeout=60)

        # Then the fixture's teardown ran and nothing it started survives
        output = pytest_run.stdout.read() if pytest_run.stdout else ""
        assert "fixture torn down" in output
        assert survivors(started) == []
    finally:
        kill_leftovers(survivors(started, timeout=0))
        if pytest_run.poll() is None:
            pytest_run.kill()
