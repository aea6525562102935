"""A stopped round of a plain torchrun-style script with DataLoader workers (tests/scripts/
plain_ddp.py) stops at a step boundary: the agent's SIGTERM reaches the ranks' interpreters and not
their DataLoader workers, so no rank raises "DataLoader worker is killed", every rank logs its stop,
rank 0 writes a snapshot of that very step, and the ranks' code ends with status 0."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    read_progress,
    round_spec,
    start_registered,
    wait_until,
)
from workers import protocol
from workers.net import free_port

__all__ = ["agent_procs", "control_queue"]

PLAIN_DDP = Path(__file__).resolve().parent / "scripts" / "plain_ddp.py"


def test_a_stop_lets_a_dataloader_script_stop_at_a_step_boundary_with_its_snapshot(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given a 2-rank plain DDP round whose ranks each read through a DataLoader worker process
    agent, _ = start_registered(agent_procs, control_queue, "host-g")
    steps = tmp_path / "steps-{rank}.jsonl"
    spec = round_spec(
        job_id=71,
        round_=1,
        node_rank=0,
        nnodes=1,
        master_port=free_port(),
        entrypoint=str(PLAIN_DDP),
        args=["--steps", "100000", "--step-sleep", "0.05", "--workers", "1", "--step-log", str(steps)],
    )
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)
    rank_logs = [Path(str(steps).replace("{rank}", str(rank))) for rank in range(2)]
    assert wait_until(
        lambda: all(sum("loss" in r for r in read_progress(path)) >= 10 for path in rank_logs), 120
    ), agent.log()[-3000:]

    # When the controller stops the job
    control_queue.send(agent.name, protocol.AGENT_STOP_JOB, job_id=71, round=1, grace_period=20.0)

    # Then the round ends STOPPED well within the grace period, every rank having logged its stop
    ended = control_queue.wait_for(
        protocol.CONTROL_ROUND_ENDED, 30, node=agent.name, match=lambda m: m.kwargs["job_id"] == 71
    )
    assert ended.kwargs["outcome"] == "stopped"
    stops = [[r for r in read_progress(path) if r.get("event") == "stop"] for path in rank_logs]
    assert all(len(found) == 1 for found in stops), stops
    stop_step = stops[0][0]["step"]
    assert stops[1][0]["step"] == stop_step
    # rank 0 saved the step it stopped at
    snapshot = agent.checkpoint_root / "job-71" / f"snapshot-{stop_step:09d}.pt"
    assert snapshot.is_file(), sorted(p.name for p in snapshot.parent.iterdir())
    # and each rank's code ended cleanly: no DataLoader worker was killed under it
    for rank in range(2):
        rank_dir = agent.data_dir / "rounds" / "job-71" / "round-1" / f"rank-{rank}"
        assert json.loads((rank_dir / "ended.json").read_text())["status"] == 0
        assert "DataLoader worker" not in (rank_dir / "stderr.log").read_text()
