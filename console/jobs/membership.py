"""``change_membership``: the one entry for every change of a job's members.

Start and resume, the operator's resize and restart, auto-scaling, preemption, drains, node
loss and failure restarts all come here, and so does a parameter-server round's worker role
changed in place (``workers=``: a resize, or a hybrid group broken by a failed worker): read a
snapshot, let console/jobs/planning.py choose (the next round: survivors, order, GPUs,
processes, what stops; or the round's workers after the change), console/jobs/wiring.py say
where the listeners go, then apply it with console/jobs/rounds.py. The caller holds decision()
and the job's row lock.
"""

from __future__ import annotations

from typing import overload

from django.conf import settings

from console.cluster.models import Node
from console.core.events import Severity
from console.core.states import RoundReason
from console.jobs.models import Job
from console.jobs.planning import Plan, Snapshot, WorkerPlan, plan_round, plan_workers
from console.jobs.rounds import Note, apply_plan, apply_workers
from console.jobs.snapshot import snapshot
from console.jobs.wiring import wire, wire_workers


@overload
def change_membership(
    job: Job,
    reason: RoundReason,
    *,
    workers: int,
    lost: int | None = None,
    snap: Snapshot | None = None,
) -> WorkerPlan | None: ...


@overload
def change_membership(
    job: Job,
    reason: RoundReason,
    *,
    leaving: Node | None = None,
    how: str = "",
    target: int | None = None,
    for_job: str = "",
    reclaimed_by: str = "",
    snap: Snapshot | None = None,
) -> Plan | None: ...


def change_membership(
    job: Job,
    reason: RoundReason,
    *,
    leaving: Node | None = None,
    how: str = "",
    target: int | None = None,
    for_job: str = "",
    reclaimed_by: str = "",
    workers: int | None = None,
    lost: int | None = None,
    snap: Snapshot | None = None,
) -> Plan | WorkerPlan | None:
    """Give ``job`` its next membership for ``reason``; returns the plan applied, or None when
    the job stays as it is.

    ``leaving`` is the node a loss or drain takes away (``how`` says what happened to it, for the
    event); ``target`` the node count a preemption shrinks to, for the higher-priority ``for_job``.
    ``workers``: a parameter-server job's worker count, changed in its current round (None when
    its nodes have no room); ``lost``, the failed worker that broke a hybrid group (FAILURE).
    ``reclaimed_by``: the workspace taking its quota back with this preemption (``target`` 0:
    the job is stopped gracefully, so its script checkpoints, and requeued).
    ``snap``: the job's snapshot when the caller (the scheduler's pass) has read it already.
    """
    snap = snap if snap is not None else snapshot(job)
    if workers is not None:
        change = plan_workers(snap, reason, workers, lost=lost)
        if change is None:
            return None
        change = wire_workers(snap, change)
        apply_workers(job, change)
        return change
    plan = plan_round(
        snap,
        reason,
        leaving=leaving.pk if leaving else None,
        target=target,
        recover_in_place=settings.INPLACE_RECOVERY,
    )
    if plan is None:
        return None
    plan = wire(snap, plan)
    apply_plan(job, plan, _note(snap, plan, leaving, how, for_job, reclaimed_by))
    return plan


def _note(
    snap: Snapshot, plan: Plan, leaving: Node | None, how: str, for_job: str, reclaimed_by: str = ""
) -> Note | None:
    """The event that tells operators why the membership changed, if the round's own does not."""
    job = snap.job
    if plan.reason is RoundReason.NODE_LOSS and leaving is not None:
        if plan.requeue:
            left = len(snap.survivors(leaving.pk)) + len(snap.free_fitting(leaving.pk))
            message = f"Node {leaving.name} {how}; {left} node(s) left, {job.min_nodes} needed"
            return Note("job.pending", message, Severity.WARNING)
        message = f"Node {leaving.name} {how}; continuing on {len(plan.placements)} node(s)"
        return Note("job.node_lost", message, Severity.WARNING, node=leaving)
    if plan.reason is RoundReason.FAILURE and plan.requeue:
        message = f"Rank failure and only {len(snap.survivors())} node(s) available; waiting for capacity"
        return Note("job.pending", message, Severity.WARNING)
    if plan.reason is RoundReason.PREEMPTION and reclaimed_by:
        if plan.requeue:
            message = (
                f"Preempted: workspace {reclaimed_by} reclaims its quota for job {for_job}; "
                "stopped gracefully to checkpoint, back in the queue"
            )
            return Note("job.preempted", message, Severity.WARNING, data={"workspace": reclaimed_by})
        message = (
            f"Shrinking to {len(plan.placements)} node(s): workspace {reclaimed_by} reclaims its "
            f"quota for job {for_job}"
        )
        return Note("job.shrunk", message, Severity.WARNING, data={"workspace": reclaimed_by})
    if plan.reason is RoundReason.PREEMPTION:
        message = (
            f"Shrinking to {len(plan.placements)} node(s) to make room for higher-priority job {for_job}"
        )
        return Note("job.shrunk", message, Severity.WARNING)
    if plan.reason is RoundReason.DRAIN and leaving is not None:
        return Note("job.drained_off", f"Moving off draining node {leaving.name}", node=leaving)
    return None
