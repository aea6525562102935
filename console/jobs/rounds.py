"""Applying the controller's decisions: a plan becomes a round (or a return to the queue), a job ends.

The only code that creates rounds and allocations, ends rounds and moves a job between states on
the controller's behalf. Each function runs inside the caller's decision() transaction and does
the whole change: persist, end the previous round, change the job's state, send the agents'
commands once it commits, emit events.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from console.cluster.models import Node
from console.core.states import AllocationState, JobState, RoundOutcome
from console.core.transport import request_tick, send_on_commit
from console.jobs.models import Allocation, Job, Round
from console.jobs.planning import Plan
from console.jobs.spec import round_spec
from console.telemetry import events
from console.telemetry.models import Severity
from workers import protocol

# MASTER_PORT range: below Linux's ephemeral range (32768+) so outgoing connections never
# hold the port we hand to rank 0's store.
MASTER_PORT_RANGE = (20000, 32000)

_OUTCOME_OF_ENDING = {
    JobState.SUCCEEDED: RoundOutcome.SUCCEEDED,
    JobState.FAILED: RoundOutcome.FAILED,
    JobState.STOPPED: RoundOutcome.STOPPED,
}


@dataclass(frozen=True)
class Note:
    """The event that says why membership changed (a lost node, a preemption, a drain ...)."""

    kind: str
    message: str
    severity: str = Severity.INFO
    node: Node | None = None


def apply_plan(job: Job, plan: Plan, note: Note | None = None) -> Round | None:
    """Carry out ``plan`` for ``job`` (locked by the caller): its next round, or back to the queue."""
    if plan.charged:
        job.restarts += 1
    previous = job.current_round()
    if plan.requeue:
        _requeue(job, previous, plan, note)
        return None
    if note is not None:
        _emit(job, note)
    return _start_round(job, previous, plan)


def _start_round(job: Job, previous: Round | None, plan: Plan) -> Round:
    nodes = Node.objects.in_bulk(plan.node_ids)
    head = nodes[plan.placements[0].node_id]
    processes = _process_rows(nodes, plan, hybrid=job.roles.get("ps", {}).get("mode") == "hybrid")
    # A round that already ended (the job waited in the queue since) had its ranks stopped then.
    still_running = previous is not None and previous.ended_at is None
    rnd = Round.objects.create(
        job=job,
        number=job.round_number + 1,
        reason=plan.reason,
        world_size=sum(len(rows) for rows in processes.values()) or len(plan.placements) * job.nproc_per_node,
        master_addr=head.address or head.hostname or "127.0.0.1",
        # A parameter-server round's "master" is its coordinator (on node rank 0).
        master_port=processes[head.pk][0]["port"] if processes else _pick_port(head),
        charged=plan.charged,
        carry_over=carry_over_of(plan, previous) if still_running else {},
    )
    for place in plan.placements:
        rows = processes.get(place.node_id, [])
        Allocation.objects.create(
            round=rnd,
            node=nodes[place.node_id],
            node_rank=place.node_rank,
            nproc=len(rows) or job.nproc_per_node,
            gpu_indices=list(place.gpus),
            processes=rows,
        )
    if previous is not None:
        end_round(previous, RoundOutcome.REPLACED)
    job.set_state(plan.reason.job_state)
    job.round_number = rnd.number
    if job.started_at is None:
        job.started_at = timezone.now()
    job.save(update_fields=["state", "round_number", "started_at", "restarts"])

    if previous is not None and still_running:
        grace = 0.0 if plan.stop_at_once else job.grace_period
        _stop_on(job, previous, plan.stop, grace)
    for alloc in rnd.allocations.select_related("node"):
        send_on_commit(protocol.AGENT_START_ROUND, alloc.node.queue, spec=round_spec(job, rnd, alloc))
    names = [nodes[p.node_id].name for p in plan.placements]
    how = ", in place" if rnd.inplace else ""
    extra: dict[str, Any] = {"inplace": True} if rnd.inplace else {}
    events.emit(
        f"round.{plan.reason.value}",
        f"Round {rnd.number}: {len(names)} node(s), world size {rnd.world_size} ({plan.reason.label}{how})",
        job=job,
        round_number=rnd.number,
        nodes=names,
        world_size=rnd.world_size,
        charged=plan.charged,
        **extra,
    )
    events.job_changed(job)
    return rnd


def carry_over_of(plan: Plan, previous: Round | None) -> dict[str, Any]:
    """The round's protocol.CarryOver: empty unless the plan is in place."""
    if not plan.inplace or previous is None:
        return {}
    return {"from_round": previous.number, "ranks": {str(old): new for old, new in plan.carry_over}}


def dense_group(members: list[tuple[Node, dict[str, Any]]], taken: set[int]) -> None:
    """Hybrid mode: makes the worker rows ``members`` (each with its node) one dense (DDP) group:
    ranks by worker index, the store on rank 0's node at a port picked like the PS ports and not
    in ``taken`` (the ports that node's rows hold)."""
    if not members:
        return
    members = sorted(members, key=lambda member: int(member[1]["index"]))
    head = members[0][0]
    master = f"{head.address or head.hostname or '127.0.0.1'}:{_pick_port(head, taken)}"
    for rank, (_, row) in enumerate(members):
        row.update(dense_rank=rank, dense_world=len(members), dense_master=master)


def ports_of(rows: list[dict[str, Any]]) -> set[int]:
    """The ports a node's process rows hold (PS, coordinator, dense stores)."""
    held = {int(row["port"]) for row in rows if "port" in row}
    return held | {int(row["dense_master"].rpartition(":")[2]) for row in rows if "dense_master" in row}


def _process_rows(
    nodes: dict[int, Node], plan: Plan, hybrid: bool = False
) -> dict[int, list[dict[str, Any]]]:
    """Each node's parameter-server processes as Allocation.processes stores them, with a port
    for those that listen (coordinator, PS) and, in hybrid mode, the workers' dense group; {} for
    an allreduce plan."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for place in plan.placements:
        if not place.processes:
            continue
        taken: set[int] = set()
        share = []
        for process in place.processes:
            row: dict[str, Any] = {"role": process.role, "index": process.index, "rank": process.rank}
            if process.role != "worker":
                row["port"] = _pick_port(nodes[place.node_id], taken)
                taken.add(row["port"])
            share.append(row)
        rows[place.node_id] = share
    if hybrid and rows:
        workers = [
            (nodes[node_id], row)
            for node_id, share in rows.items()
            for row in share
            if row["role"] == "worker"
        ]
        head = min(workers, key=lambda member: int(member[1]["index"]))[0] if workers else None
        dense_group(workers, ports_of(rows[head.pk]) if head is not None else set())
    return rows


def _requeue(job: Job, previous: Round | None, plan: Plan, note: Note | None) -> None:
    """Too few nodes remain: stop the ranks, keep the progress, wait for capacity."""
    if previous is not None:
        end_round(previous, RoundOutcome.REQUEUED)
        _stop_on(job, previous, plan.stop, job.grace_period)
    job.set_state(JobState.PENDING)
    job.save(update_fields=["state", "restarts"])
    if note is not None:
        _emit(job, note)
    events.job_changed(job)


def end_round(rnd: Round, outcome: RoundOutcome) -> None:
    """Close ``rnd`` (a round that already ended keeps its outcome) and stop its allocations."""
    if rnd.ended_at is None:
        rnd.ended_at = timezone.now()
        if rnd.round_outcome is RoundOutcome.OPEN:
            rnd.set_outcome(outcome)
        rnd.awaiting_settlement = False
        rnd.save(update_fields=["ended_at", "outcome", "awaiting_settlement"])
    for alloc in rnd.allocations.filter(state__in=[s.value for s in AllocationState if s.is_live]):
        alloc.set_state(AllocationState.STOPPED)
        alloc.save(update_fields=["state"])


def finish_job(job: Job, state: JobState, message: str, severity: str = Severity.INFO, **data: Any) -> None:
    """End ``job`` (SUCCEEDED, FAILED or STOPPED): close its round and stop what still runs."""
    rnd = job.current_round()
    job.set_state(state)
    job.finished_at = timezone.now()
    job.save(update_fields=["state", "finished_at", "failure", "restarts"])
    if rnd is not None:
        end_round(rnd, _OUTCOME_OF_ENDING[state])
        # A parameter-server job succeeds when its workers are done: its PS still serve.
        if state is not JobState.SUCCEEDED or job.is_parameter_server:
            _stop_on(job, rnd, [a.node_id for a in rnd.allocations.all()], job.grace_period)
    events.emit(f"job.{state.value.lower()}", message, job=job, severity=severity, **data)
    events.job_changed(job)
    request_tick()  # its capacity is free for the queue


def send_stop(node: Node, job_id: int, number: int, grace_period: float) -> None:
    send_on_commit(
        protocol.AGENT_STOP_JOB, node.queue, job_id=job_id, round=number, grace_period=grace_period
    )


def _stop_on(job: Job, rnd: Round, node_ids: Iterable[int], grace_period: float) -> None:
    wanted = set(node_ids)
    for alloc in rnd.allocations.select_related("node").order_by("node_rank"):
        if alloc.node_id in wanted:
            send_stop(alloc.node, job.pk, rnd.number, grace_period)


def _emit(job: Job, note: Note) -> None:
    events.emit(note.kind, note.message, job=job, node=note.node, severity=note.severity)


def _pick_port(node: Node, taken: set[int] | None = None) -> int:
    recent = set(taken or ()) | set(
        Round.objects.filter(
            allocations__node=node,
            allocations__node_rank=0,
            created_at__gte=timezone.now() - timedelta(hours=1),
        ).values_list("master_port", flat=True)
    )
    for _ in range(64):
        port = random.randrange(*MASTER_PORT_RANGE)
        if port not in recent:
            return port
    return random.randrange(*MASTER_PORT_RANGE)
