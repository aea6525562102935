"""Agents and in-place rounds, the test playing the controller: a round whose ranks cannot
re-form is reported failed in heartbeats, with the reason. (Survivors kept running, newcomers
started and "formed" reported: tests/test_inplace_resize_e2e.py, through the real controller.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.agents import (
    AgentProcs,
    ControlMessage,
    ControlQueue,
    agent_procs,
    control_queue,
    round_spec,
    start_all_registered,
)
from workers import protocol
from workers.net import free_port
from workers.protocol import RoundSpec

__all__ = ["agent_procs", "control_queue"]

SCRIPT = Path(__file__).parent / "scripts" / "elastic_count.py"
JOB = 31
EXAMPLES = 3000  # long enough for both changes; the test then speeds it up (--fast-file)


def spec(
    round_: int, node_rank: int, nnodes: int, port: int, record: Path, carry: dict[str, int] | None
) -> RoundSpec:
    out = round_spec(
        job_id=JOB,
        round_=round_,
        node_rank=node_rank,
        nnodes=nnodes,
        nproc_per_node=1,
        master_port=port,
        entrypoint=str(SCRIPT),
        args=[
            *("--record", str(record), "--examples", str(EXAMPLES), "--step-sleep", "0.05"),
            *("--fast-file", str(record.with_name("fast"))),
        ],
        grace_period=10,
    )
    if carry is not None:
        out["carry_over"] = {"from_round": round_ - 1, "ranks": carry}
    return out


def lines(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def inplace_of(message: ControlMessage, round_: int) -> str | None:
    for status in message.kwargs["rounds"]:
        if status["job_id"] == JOB and status["round"] == round_:
            return status.get("inplace")
    return None


def test_a_round_that_cannot_form_is_reported_failed_in_heartbeats(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    a, b = start_all_registered(agent_procs, control_queue, ["host-a", "host-b"])
    record = tmp_path / "record.jsonl"
    port = free_port()
    for node_rank, host in enumerate((a, b)):
        first = spec(1, node_rank, 2, port, record, None)
        first["args"] += ["--form-timeout", "2"]
        control_queue.send(host.name, protocol.AGENT_START_ROUND, spec=first)
    control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 60, match=lambda m: bool(lines(record)))

    # When round 2 is in place at world 3 but its third host never starts its rank
    port = free_port()
    for node_rank, host in enumerate((a, b)):
        second = spec(2, node_rank, 3, port, record, {"0": 0, "1": 1})
        control_queue.send(host.name, protocol.AGENT_START_ROUND, spec=second)

    # Then the hosts report the round failed to form, saying why, for the controller to fall back
    beat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 60, match=lambda m: inplace_of(m, 2) == "failed", node=a.name
    )
    status = next(s for s in beat.kwargs["rounds"] if s["round"] == 2)
    assert "not every rank was ready within 2 s" in status["inplace_reason"]
