"""Applying the controller's decisions: a plan becomes a round (or a return to the queue), a job ends.

The only code that creates rounds and allocations, ends rounds and moves a job between states on
the controller's behalf. Each function runs inside the caller's decision() transaction, decides
nothing (console/jobs/planning.py and wiring.py did: nodes, ranks, GPUs, processes, ports, what
stops) and goes through its change once, in three steps:

1. persist: the previous round ended, the new round and its allocations, the job's state;
2. emit: the events that say what happened (stored now, broadcast on commit);
3. send: the agents' commands (stops, then starts), on commit.

``apply_plan`` takes any new round of a job, parameter-server rounds included: a Plan in, rows,
events and commands out. ``apply_workers`` takes a parameter-server round's worker change in place
(a WorkerPlan: the same round, its hosts' processes rewritten, the hosts concerned sent the round
again).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from console.cluster.models import Node
from console.core import events
from console.core.events import Severity
from console.core.states import AllocationState, JobState, RoundOutcome, RoundPhase
from console.core.transport import request_tick, send_on_commit
from console.jobs.models import Allocation, Job, Round
from console.jobs.planning import Plan, WorkerPlan
from console.jobs.spec import round_spec
from workers import protocol

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
    data: dict[str, Any] = field(default_factory=dict)  # the event's data (e.g. who reclaimed)


@dataclass(frozen=True)
class Stop:
    """AGENT_STOP_JOB for one host."""

    node: Node
    job_id: int
    number: int
    grace_period: float


def apply_plan(job: Job, plan: Plan, note: Note | None = None) -> Round | None:
    """Carry out ``plan`` for ``job`` (locked by the caller): its next round, or (no placements)
    back to the queue. Returns the new round."""
    if not plan.requeue and not plan.master_port:
        raise ValueError("the plan has no listen addresses: console/jobs/wiring.py's wire() gives them")
    previous = job.current_round()
    nodes = Node.objects.in_bulk([*plan.node_ids, *plan.stop])
    # 1. persist
    if plan.charged:
        job.restarts += 1
    if previous is not None:
        end_round(previous, RoundOutcome.REQUEUED if plan.requeue else RoundOutcome.REPLACED)
    rnd, allocations = (None, []) if plan.requeue else _new_round(job, plan, nodes)
    job.set_state(JobState.PENDING if rnd is None else plan.reason.job_state)
    if rnd is not None:
        job.round_number = rnd.number
        job.started_at = job.started_at or timezone.now()
    job.save(update_fields=["state", "round_number", "started_at", "restarts"])
    # 2. emit
    if note is not None:
        events.emit(note.kind, note.message, job=job, node=note.node, severity=note.severity, **note.data)
    if rnd is not None:
        _round_event(job, rnd, plan, [nodes[p.node_id].name for p in plan.placements])
    events.job_changed(job)
    # 3. send
    if previous is not None and plan.stop:
        grace = 0.0 if plan.stop_at_once else job.grace_period
        send_stops([Stop(nodes[pk], job.pk, previous.number, grace) for pk in plan.stop])
    if rnd is not None:
        for alloc in allocations:
            spec = round_spec(job, rnd, alloc, allocations)
            send_on_commit(protocol.AGENT_START_ROUND, alloc.node.queue, spec=spec)
    return rnd


def apply_workers(job: Job, plan: WorkerPlan) -> Round:
    """Carry out ``plan`` for ``job`` (locked by the caller) in its current round."""
    rnd = job.rounds.get(number=plan.round_number)
    allocations = list(rnd.allocations.select_for_update(of=("self",)).select_related("node"))
    by_node = {alloc.node_id: alloc for alloc in allocations}
    # 1. persist
    if plan.charged:
        job.restarts += 1
        job.save(update_fields=["restarts"])
    for place in plan.placements:
        alloc = by_node[place.node_id]
        alloc.processes = [process.row() for process in place.processes]
        alloc.nproc = place.nproc
        alloc.save(update_fields=["processes", "nproc"])
    rnd.world_size = plan.world_size
    rnd.save(update_fields=["world_size"])
    # 2. emit
    _workers_event(job, plan)
    # 3. send
    for pk in plan.changed:
        spec = round_spec(job, rnd, by_node[pk], allocations)
        send_on_commit(protocol.AGENT_START_ROUND, by_node[pk].node.queue, spec=spec)
    return rnd


def _workers_event(job: Job, plan: WorkerPlan) -> None:
    added, removed = list(plan.added), list(plan.removed)
    if plan.hybrid:
        why = (
            f"worker {plan.lost} failed (restart {job.restarts} of {job.max_restarts})"
            if plan.lost is not None
            else f"worker role resized to {plan.workers}"
        )
        events.emit(
            "ps.worker_group_replaced",
            f"Hybrid job: {why}; worker(s) {removed} replaced by {added} in a new dense group that "
            "loads the dense weights saved on the PS; the PS and the coordinator run on",
            job=job,
            severity=Severity.WARNING if plan.lost is not None else Severity.INFO,
            workers=plan.workers,
            added=added,
            removed=removed,
            charged=plan.charged,
        )
        return
    events.emit(
        "ps.workers_resized",
        f"Worker role resized in place to {plan.workers}: "
        + (f"started worker(s) {added}" if added else f"stopping worker(s) {removed}")
        + "; the PS and the other workers run on",
        job=job,
        workers=plan.workers,
        added=added,
        removed=removed,
    )


def _new_round(job: Job, plan: Plan, nodes: dict[int, Node]) -> tuple[Round, list[Allocation]]:
    carry_over: dict[str, Any] = {}
    if plan.inplace:
        carry_over = {"from_round": plan.carry_from, "ranks": {str(old): new for old, new in plan.carry_over}}
    rnd = Round.objects.create(
        job=job,
        number=job.round_number + 1,
        reason=plan.reason,
        world_size=plan.world_size,
        master_addr=plan.master_addr,
        master_port=plan.master_port,
        charged=plan.charged,
        state=RoundPhase.FORMING if plan.inplace else RoundPhase.STARTING,
        inplace=plan.inplace,
        carry_over=carry_over,
    )
    allocations = Allocation.objects.bulk_create(
        Allocation(
            round=rnd,
            node=nodes[place.node_id],
            node_rank=place.node_rank,
            nproc=place.nproc,
            gpu_indices=list(place.gpus),
            processes=[process.row() for process in place.processes],
        )
        for place in plan.placements
    )
    return rnd, allocations


def _round_event(job: Job, rnd: Round, plan: Plan, names: list[str]) -> None:
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


def end_round(rnd: Round, outcome: RoundOutcome) -> None:
    """End ``rnd`` (a round that already ended keeps its outcome) and stop its allocations."""
    if not rnd.ended:
        rnd.save(update_fields=rnd.set_state(RoundPhase.ENDED, outcome=outcome))
    for alloc in rnd.allocations.filter(state__in=[s.value for s in AllocationState if s.is_live]):
        alloc.set_state(AllocationState.STOPPED)
        alloc.save(update_fields=["state"])


def finish_job(job: Job, state: JobState, message: str, severity: str = Severity.INFO, **data: Any) -> None:
    """End ``job`` (SUCCEEDED, FAILED or STOPPED): close its round and stop what still runs."""
    rnd = job.current_round()
    # 1. persist
    job.set_state(state)
    job.finished_at = timezone.now()
    job.save(update_fields=["state", "finished_at", "failure", "restarts"])
    stops: list[Stop] = []
    if rnd is not None:
        end_round(rnd, _OUTCOME_OF_ENDING[state])
        # A parameter-server job succeeds when its workers are done: its PS still serve.
        if state is not JobState.SUCCEEDED or job.is_parameter_server:
            hosts = rnd.allocations.select_related("node").order_by("node_rank")
            stops = [Stop(alloc.node, job.pk, rnd.number, job.grace_period) for alloc in hosts]
    # 2. emit
    events.emit(f"job.{state.value.lower()}", message, job=job, severity=severity, **data)
    events.job_changed(job)
    # 3. send
    send_stops(stops)
    request_tick()  # its capacity is free for the queue


def send_stops(stops: Iterable[Stop]) -> None:
    for stop in stops:
        send_on_commit(
            protocol.AGENT_STOP_JOB,
            stop.node.queue,
            job_id=stop.job_id,
            round=stop.number,
            grace_period=stop.grace_period,
        )


def send_stop(node: Node, job_id: int, number: int, grace_period: float) -> None:
    send_stops([Stop(node, job_id, number, grace_period)])
