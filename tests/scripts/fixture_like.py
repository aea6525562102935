"""A test that tests/test_processes_stop.py runs in a pytest of its own and SIGTERMs mid-test: its
fixture's process (an agent-like one, whose rank has a session of its own) must be stopped."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from subprocess import Popen
from typing import Any

import pytest

from tests.scripts.bench_like import AGENT
from tests.support import procs


@pytest.fixture
def agent_like() -> Iterator[Popen[Any]]:
    popen = procs.spawn([sys.executable, "-c", AGENT])
    deadline = time.monotonic() + 30
    while not procs.known_descendants(popen) and time.monotonic() < deadline:
        procs.remember_descendants(popen)
        time.sleep(0.05)
    try:
        yield popen
    finally:
        procs.stop(popen, grace=2)
        print("fixture torn down", flush=True)


def test_runs_until_signalled(agent_like: Popen[Any]) -> None:
    print("fixture ready", flush=True)
    time.sleep(600)
