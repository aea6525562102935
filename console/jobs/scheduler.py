"""Scheduling: the controller's periodic tick, placing pending jobs, preemption and auto-scaling.

Pending jobs are placed all-or-nothing on at least MIN nodes, by priority then submission order;
a job that does not fit shrinks lower-priority elastic jobs toward their MIN (preemption), and
later jobs wait behind it. Once the queue is empty, elastic jobs grow toward their desired count.
"""

from __future__ import annotations

from console.cluster import network
from console.cluster.watch import detect_lost_nodes, detect_silent_suspects
from console.core.decision import decision
from console.core.states import JobState, RoundReason
from console.jobs.failures import settle_failed_rounds
from console.jobs.inplace import check_forming_rounds
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job
from console.jobs.node_changes import progress_drains
from console.jobs.planning import Snapshot, needs_growth, preemption_victims
from console.jobs.progress import settle_finished
from console.jobs.snapshot import job_view, snapshot

# Pending jobs are placed by priority, then first in, first out (the queue page shows this order).
PENDING_ORDER = ("-priority", "created_at", "id")


def tick() -> None:
    """Periodic checks: lost nodes, failures awaiting settlement, in-place rounds slow to form,
    drains, pending jobs, growth; the progress of jobs that just ended (their last telemetry
    arrives after they did)."""
    detect_lost_nodes()
    detect_silent_suspects()
    settle_failed_rounds()
    network.expire_checks()
    check_forming_rounds()
    progress_drains()
    schedule()
    settle_finished()


def schedule() -> None:
    """Place pending jobs (gang: at least MIN nodes or nothing), then grow elastic jobs. Each
    job's snapshot is read once: a preemption's effect on the pending job is carried forward."""
    with decision():
        for pending in Job.objects.filter(state=JobState.PENDING).order_by(*PENDING_ORDER):
            job = Job.lock(pending.pk)
            if job.state != JobState.PENDING:
                continue
            snap = snapshot(job)
            if snap.shortfall():
                snap = _make_room_for(job, snap)
                if snap.shortfall():
                    break  # FIFO within a priority: later jobs wait behind this one
            reason = RoundReason.RESUME if job.round_number else RoundReason.START
            change_membership(job, reason, snap=snap)
            if reason is RoundReason.START and job.round_number:
                # A pair of its nodes never checked together is checked now (pairs that fail
                # keep its later rounds, and other jobs, off them).
                placed = Allocation.objects.filter(round__job=job, round__number=job.round_number)
                network.check_unchecked(list(placed.values_list("node_id", flat=True)))
        _grow_elastic_jobs()


def _grow_elastic_jobs() -> None:
    if Job.objects.filter(state=JobState.PENDING).exists():
        return  # free capacity belongs to the queue first
    for candidate in Job.objects.filter(state=JobState.RUNNING).order_by("-priority", "created_at"):
        job = Job.lock(candidate.pk)
        view = job_view(job)
        if view.round_number and needs_growth(view):
            change_membership(job, RoundReason.AUTOSCALE, snap=snapshot(job, view))


def _make_room_for(job: Job, snap: Snapshot) -> Snapshot:
    """Shrink lower-priority elastic jobs toward MIN so ``job`` fits; returns ``job``'s snapshot
    as it is then (what the shrunk jobs gave back is free)."""
    running = Job.objects.filter(
        state__in=[JobState.RUNNING, JobState.STARTING, JobState.RESIZING], priority__lt=job.priority
    ).order_by("priority", "-created_at")
    views = {view.id: view for view in (job_view(v) for v in running)}
    for victim_id, keep in preemption_victims(snap.job, snap.shortfall(), list(views.values())):
        victim = Job.lock(victim_id)
        plan = change_membership(
            victim,
            RoundReason.PREEMPTION,
            target=keep,
            for_job=job.name,
            snap=snapshot(victim, views[victim_id]),
        )
        if plan is not None:
            snap = snap.after(views[victim_id], plan)
    return snap
