"""SIGKILL of an agent leaves no rank process alive, grandchildren included, even one that left
the rank's process group (the reaper)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from tests.support.agents import (
    AgentProcs,
    ControlMessage,
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


def test_sigkill_of_the_agent_kills_every_rank_and_grandchild(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent running a DDP job and a job whose rank has a child of its own
    agent, _ = start_registered(agent_procs, control_queue, "host-k")
    progress = tmp_path / "progress.jsonl"
    ddp = round_spec(
        job_id=51,
        round_=1,
        node_rank=0,
        nnodes=1,
        master_port=free_port(),
        args=["--steps", "100000", "--step-sleep", "0.05", "--progress", str(progress)],
    )
    forking = round_spec(
        job_id=52,
        round_=1,
        node_rank=0,
        nnodes=1,
        nproc_per_node=1,
        master_port=free_port(),
        entrypoint="/bin/sh",
        # One child stays in the rank's process group; the other leaves it (setsid).
        args=[
            "-c",
            'sleep 300 & echo $! > "$OUT/grandchild"; setsid sleep 301 & echo $! > "$OUT/escaped"; wait',
        ],
        env={"OUT": str(tmp_path)},
    )
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=ddp)
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=forking)
    grandchild_file = tmp_path / "grandchild"
    assert wait_until(lambda: any("step" in line for line in read_progress(progress)), 90), agent.log()[
        -3000:
    ]
    escaped_file = tmp_path / "escaped"

    def written(path: Path) -> bool:
        return path.exists() and path.read_text().strip() != ""

    assert wait_until(lambda: written(grandchild_file) and written(escaped_file), 10)

    def both_running(message: ControlMessage) -> bool:
        return len(rank_pids(message, 51, 1)) == 2 and len(rank_pids(message, 52, 1)) == 1

    heartbeat = control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 10, node=agent.name, match=both_running)
    escaped = int(escaped_file.read_text())
    assert wait_until(lambda: psutil.Process(escaped).name() == "sleep", 5)  # setsid has exec'd
    assert os.getpgid(escaped) != rank_pids(heartbeat, 52, 1)[0]
    pids = [
        *rank_pids(heartbeat, 51, 1),
        *rank_pids(heartbeat, 52, 1),
        int(grandchild_file.read_text()),
        escaped,
    ]
    created = {pid: psutil.Process(pid).create_time() for pid in pids}
    assert all(pid_alive(pid, created[pid]) for pid in pids)

    # When the agent is killed with SIGKILL
    agent.kill()

    # Then every rank and both grandchildren are gone within a few seconds
    assert wait_until(lambda: not any(pid_alive(pid, created[pid]) for pid in pids), 5), [
        pid for pid in pids if pid_alive(pid, created[pid])
    ]
