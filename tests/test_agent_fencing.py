"""Fencing: a start for an older round is ignored; a newer round of a job first stops the
running one (SIGTERM: the script checkpoints) and only then starts; a stop ends a round
without reporting its ranks as failures."""

from __future__ import annotations

from pathlib import Path

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    pid_alive,
    rank_pids,
    read_progress,
    round_spec,
    start_registered,
    wait_until,
)
from workers import protocol
from workers.net import free_port

__all__ = ["agent_procs", "control_queue"]


def test_older_rounds_are_ignored_and_a_newer_round_replaces_the_running_one(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent running round 2 of a job
    agent, _ = start_registered(agent_procs, control_queue, "host-r")
    progress = tmp_path / "progress.jsonl"
    args = [
        "--steps",
        "100000",
        "--step-sleep",
        "0.05",
        "--checkpoint-every",
        "1000",
        "--progress",
        str(progress),
    ]

    def spec(round_: int) -> protocol.RoundSpec:
        return round_spec(job_id=61, round_=round_, node_rank=0, nnodes=1, master_port=free_port(), args=args)

    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec(2))
    assert wait_until(lambda: any(line.get("round") == 2 for line in read_progress(progress)), 90)

    # When a start for the older round 1 arrives, then one for round 3
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec(1))
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec(3))

    # Then round 2 is stopped (not failed: no rank exits reported) before round 3 starts
    ended_2 = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=agent.name, job_id=61, round=2)
    assert ended_2.kwargs["outcome"] == "stopped"
    assert ended_2.kwargs["failures"] == []
    assert wait_until(lambda: any(line.get("round") == 3 for line in read_progress(progress)), 90)
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 10, node=agent.name, match=lambda m: len(rank_pids(m, 61, 3)) == 2
    )
    # Round 3's ranks may be warm interpreters the pool started while round 2 ran, so its launch
    # is read off its round directory: the agent makes its rank directories when it launches.
    round_3_started = (agent.data_dir / "rounds" / "job-61" / "round-3").stat().st_mtime
    lines = read_progress(progress)
    round_2_steps = [line for line in lines if line.get("round") == 2]
    starts = [line for line in lines if line.get("event") == "start"]
    assert len(starts) == 2
    # Round 2 checkpointed on SIGTERM at its last step; round 3 resumed from exactly there ...
    assert starts[1]["resume_step"] == round_2_steps[-1]["step"]
    # ... and it was launched after round 2's last step.
    assert round_3_started >= round_2_steps[-1]["t"]
    # Round 1 never ran: the agent made no files for it and reported nothing about it.
    assert not (agent.data_dir / "rounds" / "job-61" / "round-1").exists()
    assert {
        status["round"]
        for m in control_queue.history
        if m.task == protocol.CONTROL_HEARTBEAT
        for status in m.kwargs["rounds"]
    } <= {2, 3}

    # When the controller stops the job
    control_queue.send(agent.name, protocol.AGENT_STOP_JOB, job_id=61, round=3, grace_period=10)

    # Then round 3 ends "stopped", its ranks are gone and none was reported as exited
    ended_3 = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, node=agent.name, job_id=61, round=3)
    assert ended_3.kwargs["outcome"] == "stopped"
    assert not any(
        m.task == protocol.CONTROL_RANK_EXITED and m.kwargs["job_id"] == 61 for m in control_queue.history
    )
    assert wait_until(lambda: not any(pid_alive(pid) for pid in rank_pids(heartbeat, 61, 3)), 5)
