"""Agents on one machine, each its own "host", run a 2-node x 2-process DDP job (real Celery
workers, real gloo ranks); the test plays the controller through the real queues."""

from __future__ import annotations

from pathlib import Path

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    read_progress,
    round_spec,
    start_all_registered,
    wait_until,
)
from workers import protocol
from workers.net import free_port

__all__ = ["agent_procs", "control_queue"]

JOB_TIMEOUT = 120.0


def test_two_agents_run_a_two_node_job_to_completion(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given two registered agents
    hosts = start_all_registered(agent_procs, control_queue, ["host-a", "host-b"])
    progress = tmp_path / "progress.jsonl"
    args = ["--steps", "40", "--checkpoint-every", "10", "--progress", str(progress)]
    port = free_port()

    # When the controller starts round 1 of a 2-node job on both
    for node_rank, host in enumerate(hosts):
        spec = round_spec(job_id=11, round_=1, node_rank=node_rank, nnodes=2, master_port=port, args=args)
        control_queue.send(host.name, protocol.AGENT_START_ROUND, spec=spec)

    # Then both report the round succeeded, every rank exited 0, and training ran at world 4
    for host in hosts:
        ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, JOB_TIMEOUT, node=host.name, job_id=11)
        assert ended.kwargs["outcome"] == "succeeded", host.log()[-3000:]
        assert ended.kwargs["failures"] == []
        assert ended.kwargs["round"] == 1
        assert "token" not in ended.kwargs and ended.kwargs["seal"]["mac"]  # sealed, secret not sent
    exits = sorted(
        (control_queue.wait_for(protocol.CONTROL_RANK_EXITED, 10, job_id=11) for _ in range(4)),
        key=lambda message: int(message.kwargs["exit"]["rank"]),
    )
    assert [e.kwargs["exit"]["rank"] for e in exits] == [0, 1, 2, 3]
    assert [e.kwargs["exit"]["exit_code"] for e in exits] == [0, 0, 0, 0]
    assert {e.kwargs["node"] for e in exits[:2]} == {"host-a"}
    assert {e.kwargs["node"] for e in exits[2:]} == {"host-b"}
    steps = [line for line in read_progress(progress) if "step" in line]
    assert [line["step"] for line in steps] == list(range(1, 41))
    assert {line["world"] for line in steps} == {4}
    assert {line["round"] for line in steps} == {1}
    # Both agents share one checkpoint directory per job (the shared-storage layout).
    assert (agent_procs.root / "checkpoints" / "job-11" / "checkpoint.pt").is_file()
    # Every rank's stdout was captured to its own file under the agent's data dir.
    for host, local_rank, rank in [(hosts[0], 0, 0), (hosts[0], 1, 1), (hosts[1], 0, 2), (hosts[1], 1, 3)]:
        stdout = host.data_dir / "rounds" / "job-11" / "round-1" / f"rank-{local_rank}" / "stdout.log"
        assert f"rank {rank}: finished 40 steps" in stdout.read_text()


def test_three_agents_continue_a_job_on_a_new_round_after_losing_a_host(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given three registered agents and a 2-node job running on host-a and host-b
    a, b, c = start_all_registered(agent_procs, control_queue, ["host-a", "host-b", "host-c"])
    progress = tmp_path / "progress.jsonl"
    args = ["--steps", "40", "--step-sleep", "0.05", "--checkpoint-every", "5", "--progress", str(progress)]
    port = free_port()
    for node_rank, host in enumerate((a, b)):
        # A short grace: ranks whose peers vanished can take seconds to exit on their own.
        spec = round_spec(
            job_id=12, round_=1, node_rank=node_rank, nnodes=2, master_port=port, args=args, grace_period=2
        )
        control_queue.send(host.name, protocol.AGENT_START_ROUND, spec=spec)
    assert wait_until(lambda: any(line.get("step", 0) >= 8 for line in read_progress(progress)), JOB_TIMEOUT)

    # When host-b dies (SIGKILL) and the controller starts round 2 on host-a and host-c
    b.kill()
    port = free_port()
    for node_rank, host in enumerate((a, c)):
        spec = round_spec(job_id=12, round_=2, node_rank=node_rank, nnodes=2, master_port=port, args=args)
        control_queue.send(host.name, protocol.AGENT_START_ROUND, spec=spec)

    # Then host-a ends round 1 (stopped by the agent or failed because its peers vanished),
    # and round 2 resumes from the checkpoint and finishes on host-a and host-c
    ended_1 = control_queue.wait_for(
        protocol.CONTROL_ROUND_ENDED, JOB_TIMEOUT, node="host-a", job_id=12, round=1
    )
    assert ended_1.kwargs["outcome"] in ("stopped", "failed")
    for host in (a, c):
        ended = control_queue.wait_for(
            protocol.CONTROL_ROUND_ENDED, JOB_TIMEOUT, node=host.name, job_id=12, round=2
        )
        assert ended.kwargs["outcome"] == "succeeded", host.log()[-3000:]
    lines = read_progress(progress)
    starts = [line for line in lines if line.get("event") == "start"]
    assert len(starts) == 2
    assert starts[1]["resume_step"] >= 5
    round_2_steps = [line["step"] for line in lines if line.get("round") == 2]
    assert round_2_steps == list(range(starts[1]["resume_step"] + 1, 41))
