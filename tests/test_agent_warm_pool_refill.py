"""The warm pool's refill policy: it keeps two rounds' worth of interpreters, so a restart right
after a launch starts warm, and it imports only with CPU the ranks leave idle: an import is
paused (SIGSTOP) while every core is busy and resumed when one is free, and a paused interpreter
never outlives a SIGKILLed agent."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.agents import (
    AgentProcess,
    AgentProcs,
    ControlMessage,
    ControlQueue,
    agent_procs,
    control_queue,
    pid_alive,
    rank_pids,
    start_registered,
    wait_until,
)
from tests.test_agent_warm_pool import exit_of, probe_spec, start_probe, warm_pids, write_probe
from workers import protocol
from workers.agent.warmpool import DEFAULT_WARM_POOL

# The pool pauses imports while the host's cores are busy: these run alone (tests/conftest.py).
pytestmark = pytest.mark.alone

__all__ = ["agent_procs", "control_queue"]


@pytest.fixture
def busy_cores() -> Iterator[list[subprocess.Popen[bytes]]]:
    """One spinning process per core, until the test stops them (or ends)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield spinners
    finally:
        stop(spinners)


def stop(spinners: list[subprocess.Popen[bytes]]) -> None:
    for spinner in spinners:
        with contextlib.suppress(ProcessLookupError):
            spinner.kill()
        spinner.wait()


def paused_pid(agent: AgentProcess) -> int | None:
    """The warm interpreter the agent logged as paused and that is stopped right now."""
    for line in agent.log().splitlines():
        if "warm pool: paused pid" in line:
            pid = int(line.rsplit(" ", 1)[1])
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                    return pid
    return None


def start_paused(agent_procs: AgentProcs, control_queue: ControlQueue, name: str) -> tuple[AgentProcess, int]:
    """An agent that wants one warm interpreter, started while every core is busy, and the pid
    of that interpreter once its import is paused."""
    agent_procs.warm_pool = 1
    agent, _ = start_registered(agent_procs, control_queue, name)
    assert wait_until(lambda: paused_pid(agent) is not None, 30), agent.log()[-3000:]
    pid = paused_pid(agent)
    assert pid is not None
    return agent, pid


def started_ranks(agent: AgentProcess, job_id: int, round_: int) -> tuple[list[int], list[str]]:
    """The pids and start kinds the agent logged for a round ("started ranks [...] (pids [...],
    ['warm', 'cold'])")."""
    pattern = re.compile(
        rf"job {job_id} round {round_}: started ranks \[[\d, ]+\] \(pids \[([\d, ]+)\], \[([^\]]*)\]\)"
    )
    found = pattern.search(agent.log())
    assert found, agent.log()[-3000:]
    return [int(p) for p in found[1].split(", ")], [k.strip(" '") for k in found[2].split(",")]


def test_a_restart_right_after_a_launch_starts_warm(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent with the default pool, full
    agent_procs.warm_pool = None
    agent, _ = start_registered(agent_procs, control_queue, "host-ahead")
    assert wait_until(lambda: len(warm_pids(agent)) == DEFAULT_WARM_POOL, 90), agent.log()[-3000:]
    warm = warm_pids(agent)
    write_probe(tmp_path)

    # When a 2-rank round starts and, at once, the job's next round replaces it
    first = probe_spec(tmp_path, 91, nproc=2, entrypoint="probe.py", args=["sleep"])
    second = probe_spec(tmp_path, 91, nproc=2, entrypoint="probe.py", args=["sleep"])
    second["round"] = 2
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=first)
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=second)

    def round_two_running(message: ControlMessage) -> bool:
        return len(rank_pids(message, 91, 2)) == 2

    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 60, node=agent.name, match=round_two_running
    )

    # Then both rounds ran on interpreters that were ready before either started
    first_pids, how = started_ranks(agent, 91, 1)
    assert how == ["warm", "warm"]
    second_pids = rank_pids(heartbeat, 91, 2)
    assert started_ranks(agent, 91, 2) == (second_pids, ["warm", "warm"])
    assert set(first_pids) | set(second_pids) <= set(warm), (first_pids, second_pids, warm)
    assert not set(first_pids) & set(second_pids)
    control_queue.send(agent.name, protocol.AGENT_STOP_JOB, job_id=91, round=2, grace_period=5.0)
    control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=agent.name, job_id=91, round=2)


def test_an_import_waits_while_every_core_is_busy(
    agent_procs: AgentProcs,
    control_queue: ControlQueue,
    tmp_path: Path,
    busy_cores: list[subprocess.Popen[bytes]],
) -> None:
    # Given every core busy, and an agent that wants one warm interpreter
    # Then its import is paused: stopped, and still stopped a few seconds later
    agent, pid = start_paused(agent_procs, control_queue, "host-busy")
    before = sum(psutil.Process(pid).cpu_times()[:2])
    assert not wait_until(lambda: paused_pid(agent) != pid, 3)
    assert sum(psutil.Process(pid).cpu_times()[:2]) == before

    # When the cores are free again
    stop(busy_cores)

    # Then the import resumes and finishes, and the interpreter becomes a rank like any other
    assert wait_until(lambda: f"resumed pid {pid}" in agent.log(), 30), agent.log()[-3000:]
    assert wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_SLEEPING, 60)
    write_probe(tmp_path)
    start_probe(control_queue, agent, tmp_path, 92, "exit3")
    exit_ = exit_of(control_queue, 92, 0)
    assert exit_["pid"] == pid
    assert exit_["exit_code"] == 3


def test_a_paused_import_dies_with_a_sigkilled_agent(
    agent_procs: AgentProcs, control_queue: ControlQueue, busy_cores: list[subprocess.Popen[bytes]]
) -> None:
    # Given an agent whose warm interpreter is paused (every core busy)
    agent, pid = start_paused(agent_procs, control_queue, "host-busy-kill")
    created = psutil.Process(pid).create_time()

    # When the agent is SIGKILLed
    agent.kill()

    # Then the stopped interpreter is gone too
    assert wait_until(lambda: not pid_alive(pid, created), 5)
