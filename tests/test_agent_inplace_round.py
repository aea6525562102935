"""Agents carry an SDK job's ranks into in-place rounds: survivors keep their processes, only
newcomers start, and heartbeats say when every rank has re-formed (the test plays the controller)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.agents import (
    AgentProcs,
    ControlMessage,
    ControlQueue,
    agent_procs,
    control_queue,
    free_port,
    rank_pids,
    round_spec,
    start_all_registered,
)
from workers import protocol
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


def wait_formed(queue: ControlQueue, node: str, round_: int) -> ControlMessage:
    return queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 60, match=lambda m: inplace_of(m, round_) == "formed", node=node
    )


def test_an_sdk_job_is_resized_in_place_2_to_3_to_2(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    a, b, c = start_all_registered(agent_procs, control_queue, ["host-a", "host-b", "host-c"])
    record = tmp_path / "record.jsonl"
    # Given round 1 on host-a and host-b
    port = free_port()
    for node_rank, host in enumerate((a, b)):
        control_queue.send(
            host.name, protocol.AGENT_START_ROUND, spec=spec(1, node_rank, 2, port, record, None)
        )
    first = {
        host.name: rank_pids(
            control_queue.wait_for(
                protocol.CONTROL_HEARTBEAT, 60, match=lambda m: bool(rank_pids(m, JOB, 1)), node=host.name
            ),
            JOB,
            1,
        )
        for host in (a, b)
    }
    control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 60, match=lambda m: bool(lines(record)))

    # When round 2 adds host-c in place
    port = free_port()
    carry = {"0": 0, "1": 1}
    for node_rank, host in enumerate((a, b, c)):
        control_queue.send(
            host.name, protocol.AGENT_START_ROUND, spec=spec(2, node_rank, 3, port, record, carry)
        )
    # Then every host reports the round formed, and host-a and host-b kept their rank processes
    for host in (a, b, c):
        beat = wait_formed(control_queue, host.name, 2)
        if host is not c:
            assert rank_pids(beat, JOB, 2) == first[host.name]

    # When round 3 takes host-c out again (it is stopped, the others carry over)
    port = free_port()
    control_queue.send(c.name, protocol.AGENT_STOP_JOB, job_id=JOB, round=2, grace_period=10)
    for node_rank, host in enumerate((a, b)):
        control_queue.send(
            host.name, protocol.AGENT_START_ROUND, spec=spec(3, node_rank, 2, port, record, carry)
        )
    for host in (a, b):
        beat = wait_formed(control_queue, host.name, 3)
        assert rank_pids(beat, JOB, 3) == first[host.name]
    stopped = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=c.name, job_id=JOB)
    assert stopped.kwargs["round"] == 2 and stopped.kwargs["outcome"] == "stopped"
    record.with_name("fast").touch()

    # Then the job ends in round 3 with every example of the epoch seen exactly once
    for host in (a, b):
        ended = control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 120, node=host.name, job_id=JOB)
        assert (ended.kwargs["round"], ended.kwargs["outcome"]) == (3, "succeeded"), host.log()[-3000:]
    steps = [line for line in lines(record) if "indices" in line]
    assert {line["world"] for line in steps} == {2, 3}
    counted = Counter(i for line in steps for i in line["indices"])
    assert sorted(counted) == list(range(EXAMPLES)) and set(counted.values()) == {1}
    ends = [line for line in lines(record) if line.get("end")]
    assert sorted(e["left"] for e in ends) == [False, False, True]


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
