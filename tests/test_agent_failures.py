"""A rank that raises is reported with its traceback, within a second, and fails the round."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    pid_alive,
    rank_pids,
    round_spec,
    start_registered,
    wait_until,
)
from workers import protocol
from workers.net import free_port

__all__ = ["agent_procs", "control_queue"]


def test_a_rank_that_raises_is_reported_with_its_traceback(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent running a 1-node x 2-process job whose rank 1 raises at step 3
    agent, _ = start_registered(agent_procs, control_queue, "host-f")
    args = ["--steps", "200", "--step-sleep", "0.05", "--fail-at-step", "3", "--fail-rank", "1"]
    spec = round_spec(job_id=41, round_=1, node_rank=0, nnodes=1, master_port=free_port(), args=args)

    # When the round starts (the test watches rank 1's pid to see when it really exits)
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 60, node=agent.name, match=lambda m: len(rank_pids(m, 41, 1)) == 2
    )
    rank_1 = rank_pids(heartbeat, 41, 1)[1]
    assert wait_until(lambda: not pid_alive(rank_1), 90, interval=0.02)
    exited_at = time.time()

    # Then rank 1's exit is reported with exit code 1 and the Python traceback from its error file
    exited = control_queue.wait_for(
        protocol.CONTROL_RANK_EXITED, 90, job_id=41, match=lambda m: m.kwargs["exit"]["rank"] == 1
    )
    exit_ = exited.kwargs["exit"]
    assert exited.kwargs["round"] == 1
    assert exit_["exit_code"] == 1
    assert exit_["signal"] is None
    assert "Traceback (most recent call last)" in exit_["error"]
    assert "RuntimeError: injected failure at step 3 on rank 1" in exit_["error"]
    assert "ddp_train.py" in exit_["error"]
    # ... noticed within a second of the exit.
    assert exit_["pid"] == rank_1
    assert exit_["at"] - exited_at < 1.0

    # And the round ends "failed" with that failure listed; rank 0 did not keep training
    ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=agent.name, job_id=41)
    assert ended.kwargs["outcome"] == "failed"
    assert 1 in [failure["rank"] for failure in ended.kwargs["failures"]]
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT,
        10,
        node=agent.name,
        match=lambda m: [status["state"] for status in m.kwargs["rounds"]] == ["failed"],
    )
    (status,) = heartbeat.kwargs["rounds"]
    assert {rank["state"] for rank in status["ranks"]} <= {"failed", "stopped"}
