"""A rank whose Python code has ended but whose interpreter then dies or hangs while tearing down
(torch 2.13's gloo does both now and then: workers/agent/runner.py) is reported with the exit
code its code ended with, and what the teardown did; a rank that dies before its code ends is a
failure as before. Cold ranks (no pool) and warm ones alike."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    one_rank_round,
    pid_alive,
    wait_until,
    warm_processes,
)
from workers import protocol

__all__ = ["agent_procs", "control_queue"]

PROBE = """
import os, resource, signal, sys, time

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class InTeardown:
    # Kept in sys.modules, it is dropped when the interpreter clears the modules: after the
    # atexit handlers, in the teardown.
    def __init__(self, act):
        self.act = act

    def __del__(self):
        self.act()


def abort(kill=os.kill, pid=os.getpid(), sig=signal.SIGABRT):
    kill(pid, sig)


def hang(sleep=time.sleep):
    sleep(3600)


mode = sys.argv[1]
print("probe", mode, flush=True)
if mode == "abort-midway":
    abort()
sys.modules["_in_teardown"] = InTeardown(hang if mode == "hang" else abort)
if mode == "exit-3":
    sys.exit(3)
if mode == "raise":
    raise RuntimeError("probe raised")
"""

# mode -> (exit_code, signal, teardown) the agent reports
EXPECTED: dict[str, tuple[int | None, str | None, str | None]] = {
    "ends": (0, None, "SIGABRT"),
    "exit-3": (3, None, "SIGABRT"),
    "raise": (1, None, "SIGABRT"),
    "abort-midway": (None, "SIGABRT", None),
    "hang": (0, None, "hung"),
}
TEARDOWN_TIMEOUT = 2.0


def run_probes(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path, name: str
) -> dict[str, Any]:
    """Starts one agent, runs one 1-rank job per mode, and returns each mode's rank exit and
    round end, and when the hanging rank's code ended."""
    agent = agent_procs.start(name, extra_args=["--teardown-timeout", str(TEARDOWN_TIMEOUT)])
    control_queue.wait_for(protocol.CONTROL_REGISTER, 30, node=name)
    if agent_procs.warm_pool:
        assert wait_until(lambda: len(warm_processes(agent)) >= len(EXPECTED), 90), agent.log()[-3000:]
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    jobs = {}
    for job_id, mode in enumerate(EXPECTED, start=70):
        spec = one_rank_round(job_id, probe, [mode])
        control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)
        jobs[mode] = job_id
    results: dict[str, Any] = {"agent": agent}
    for mode, job_id in jobs.items():
        exited = control_queue.wait_for(protocol.CONTROL_RANK_EXITED, 60, job_id=job_id)
        ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, job_id=job_id)
        end_file = agent.data_dir / "rounds" / f"job-{job_id}" / "round-1" / "rank-0" / "ended.json"
        results[mode] = (exited.kwargs["exit"], ended.kwargs["outcome"], end_file)
    return results


@pytest.mark.parametrize(
    "warm_pool",
    # warm: alone, the pool holds its imports while the cores are busy, by design
    [0, pytest.param(len(EXPECTED), marks=pytest.mark.alone)],
    ids=["cold", "warm"],
)
def test_a_crash_in_teardown_does_not_change_how_the_code_ended(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path, warm_pool: int
) -> None:
    # Given an agent (no pool: every rank cold; a full pool: every rank warm) that kills a rank
    # 2 s after its code ended
    agent_procs.warm_pool = warm_pool

    # When one-rank jobs run a script that ends (returns, sys.exit(3), raises) and then dies by
    # SIGABRT or hangs in the interpreter's teardown, and one that SIGABRTs itself before it ends
    results = run_probes(agent_procs, control_queue, tmp_path, f"host-teardown-{warm_pool}")

    # Then each rank is reported with the status its code ended with and what the teardown did;
    # the rank that died before its code ended failed by its signal, as before
    for mode, (exit_code, signal_, teardown) in EXPECTED.items():
        exit_, outcome, _ = results[mode]
        assert (exit_["exit_code"], exit_["signal"], exit_.get("teardown")) == (
            exit_code,
            signal_,
            teardown,
        ), (
            mode,
            exit_,
            results["agent"].log()[-3000:],
        )
        assert outcome == ("succeeded" if exit_code == 0 else "failed"), (mode, outcome)
    assert "RuntimeError: probe raised" in results["raise"][0]["error"]
    assert results["ends"][0]["error"] == "" and results["hang"][0]["error"] == ""
    # ... the hanging rank was killed about --teardown-timeout after its code ended, not sooner
    hang_exit, _, end_file = results["hang"]
    waited = hang_exit["at"] - end_file.stat().st_mtime
    assert TEARDOWN_TIMEOUT <= waited < TEARDOWN_TIMEOUT + 3, waited
    assert wait_until(lambda: not pid_alive(hang_exit["pid"]), 5)


def test_a_record_left_by_an_earlier_attempt_is_not_taken_for_this_ones(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent that kills a rank 2 s after its code ended, and an end record left in the
    # rank's directory by an earlier attempt of the same round, a minute old
    agent_procs.warm_pool = 0
    agent = agent_procs.start("host-teardown-stale", extra_args=["--teardown-timeout", str(TEARDOWN_TIMEOUT)])
    control_queue.wait_for(protocol.CONTROL_REGISTER, 30, node=agent.name)
    stale = agent.data_dir / "rounds" / "job-79" / "round-1" / "rank-0" / "ended.json"
    stale.parent.mkdir(parents=True)
    stale.write_text('{"status": 0, "pid": 1, "at": 0}')
    os.utime(stale, (time.time() - 60, time.time() - 60))
    probe = tmp_path / "long.py"
    probe.write_text("import time\ntime.sleep(5)\nprint('done', flush=True)\n")

    # When that round starts again with a rank whose code runs 5 s
    started = time.time()
    spec = one_rank_round(79, probe)
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)

    # Then the rank runs to its end and exits 0 on its own, and its own record replaced the old
    exited = control_queue.wait_for(protocol.CONTROL_RANK_EXITED, 60, job_id=79).kwargs["exit"]
    assert (exited["exit_code"], exited["signal"], exited.get("teardown")) == (0, None, None)
    assert exited["at"] - started >= 5
    assert json.loads(stale.read_text())["pid"] == exited["pid"]
