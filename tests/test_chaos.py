"""Chaos, the short version of bench/chaos: one run of each fault while a plain DDP script trains.

A console runs as docker-compose runs it (web, controller, ingest and three agents, each its own
process, on a PostgreSQL cluster and a Redis server of the test's own, so that both can be
restarted). Each test trains tests/scripts/plain_ddp.py on the three agents, injects one fault,
lets the console heal and the job train on, ends the job and asserts issue 11's figure: the job
SUCCEEDED, no metric point or log line lost or stored twice (the script's own step log against
the database), no orphan process, no 5xx answer to a client polling the API, and a step sequence
that never goes back more than one checkpoint interval nor skips ahead.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from bench.chaos.console import ComposeConsole
from bench.chaos.faults import FAULTS, CaseResult, Timing, run_case
from bench.chaos.infra import sweep

# Each fault has a time budget: these run alone, not beside another worker (tests/conftest.py).
pytestmark = [pytest.mark.cluster, pytest.mark.alone]

TIMING = Timing(
    warmup_steps=10,
    after_steps=10,
    start_timeout=150.0,
    heal_timeout=90.0,
    finish_timeout=60.0,
    outage=1.0,
)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="module")
def chaos_console() -> Iterator[ComposeConsole]:
    """The console for every fault of this module; every process it started is gone after it,
    on failure, Ctrl-C and SIGTERM too (its children also die with the test process)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    run_id = uuid.uuid4().hex[:12]
    # Not pytest's tmp_path: PostgreSQL runs as its own user and must reach its directory.
    root = Path(tempfile.mkdtemp(prefix="trainyard-chaos-test-"))
    root.chmod(0o755)
    console = ComposeConsole(root / "compose", run_id)
    try:
        console.start()
        yield console
    finally:
        try:
            console.close()
        finally:
            sweep(run_id)
            shutil.rmtree(root, ignore_errors=True)
            signal.signal(signal.SIGTERM, previous)


def report(result: CaseResult) -> str:
    return (
        f"{result.fault}: {result.detail}; state {result.state}, next step {result.recovered_s} s, "
        f"points {result.points}, lines {result.lines}, orphans {result.orphans}, 5xx {result.http_5xx} "
        f"({result.first_5xx[:200]}), sequence {result.problems}, notes {result.notes}"
    )


@pytest.mark.parametrize("fault", FAULTS)
def test_the_job_rides_out_the_fault_and_loses_nothing(chaos_console: ComposeConsole, fault: str) -> None:
    # Given a job of the plain script training on three agents
    # When the fault hits while it trains, and the console heals
    result = run_case(chaos_console, fault, TIMING)

    # Then the job finished, training went on from the last snapshot, nothing was lost or
    # stored twice, nothing was left running and the API never failed
    summary = report(result)
    assert result.state == "SUCCEEDED", summary
    assert result.recovered_s is not None, summary
    assert result.problems == [], summary
    assert result.redone is not None and result.redone <= 10, summary
    assert result.points is not None and result.points.expected > 0, summary
    assert result.points.duplicated == 0, summary
    assert result.lines is not None and result.lines.duplicated == 0, summary
    # A killed agent's unsent telemetry is sent by the agent that replaces it (shipper.py).
    assert (result.points.lost, result.lines.lost) == (0, 0), summary
    assert result.orphans == [], summary
    # A PostgreSQL restart included: requests wait for the database (console/core/dbwait.py).
    assert result.http_5xx == 0, summary
