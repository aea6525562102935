"""Scheduling: the controller's periodic tick, placing pending jobs, quotas, reclaim and growth.

Pending jobs are placed all-or-nothing on at least MIN nodes. Which job is tried next is the
fair queue's word (console/teams/fairshare.py): in a pool with quotas, jobs within their
workspace's nominal quota first, then borrowers by dominant share over weight; by priority then
submission within a workspace. A job within its quota that does not fit takes its quota back
from borrowers, shrinking their elastic jobs before preempting any (console/teams/reclaim.py);
a pool without quotas is today's strict priority order, where a job that does not fit shrinks
lower-priority elastic jobs toward their MIN and the jobs after it wait. Each pending job keeps
the reason it waits (``Job.wait_reason``). Elastic jobs grow toward their desired count while
no job waits for room, within their workspace's quota and borrowing limit.
"""

from __future__ import annotations

from console.cluster import network
from console.cluster.watch import detect_lost_nodes, detect_silent_suspects
from console.core.decision import decision
from console.core.states import JobState, RoundReason
from console.jobs import quotas
from console.jobs.failures import settle_failed_rounds
from console.jobs.hangs import conclude_gathered
from console.jobs.inplace import check_forming_rounds
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job
from console.jobs.node_changes import progress_drains
from console.jobs.planning import Plan, Snapshot, needs_growth, preemption_victims
from console.jobs.progress import settle_finished
from console.jobs.snapshot import job_view, snapshot
from console.teams.fairshare import Ask, FairQueue, Ledger
from console.teams.reclaim import reclaim

# Pending jobs are placed by priority, then first in, first out (the queue page shows this order).
PENDING_ORDER = ("-priority", "created_at", "id")
RUNNING = [JobState.RUNNING, JobState.STARTING, JobState.RESIZING]
# Reasons written per UPDATE statement: large enough that a queue of thousands costs a few.
REASONS_PER_UPDATE = 500


def tick() -> None:
    """Periodic checks: lost nodes, failures awaiting settlement, in-place rounds slow to form,
    hangs whose stacks are gathered, drains, pending jobs, growth; the progress of jobs that just ended (their last telemetry
    arrives after they did)."""
    detect_lost_nodes()
    detect_silent_suspects()
    settle_failed_rounds()
    network.expire_checks()
    check_forming_rounds()
    conclude_gathered()
    progress_drains()
    schedule()
    settle_finished()


def schedule(shrink: bool = True) -> None:
    """Place pending jobs in the fair queue's order, then grow elastic jobs. Each job's snapshot
    is read once: a preemption's effect on the pending job is carried forward. ``shrink`` False:
    reclaim by preemption only (the bench's comparison)."""
    with decision():
        pending = list(Job.objects.filter(state=JobState.PENDING).select_related("workspace", "pool"))
        ledger = quotas.ledger()
        queue = FairQueue(ledger, [quotas.ask_of(job) for job in pending])
        reasons: dict[int, str] = {}
        waiting_for_room = False
        for ask in queue:
            verdict = ledger.check(ask)
            if not verdict.admissible:
                reasons[ask.job_id] = verdict.message
                queue.skipped()
                continue
            job = Job.lock(ask.job_id)
            if job.state != JobState.PENDING:
                queue.skipped()
                continue
            snap = snapshot(job)
            if snap.shortfall():
                if ledger.enforced(ask.pool):
                    if verdict.reclaims:
                        snap = _reclaim_for(job, ask, snap, ledger, shrink)
                else:
                    snap = _make_room_for(job, snap)
            if snap.shortfall():
                reasons[ask.job_id] = _no_room(snap, ask, ledger)
                waiting_for_room = True
                queue.blocked()
                continue
            reason = RoundReason.RESUME if job.round_number else RoundReason.START
            plan = change_membership(job, reason, snap=snap)
            queue.placed(ask, _units(snap, plan) if plan is not None else 0)
            reasons[ask.job_id] = ""
            if reason is RoundReason.START and job.round_number:
                # A pair of its nodes never checked together is checked now (pairs that fail
                # keep its later rounds, and other jobs, off them).
                placed = Allocation.objects.filter(round__job=job, round__number=job.round_number)
                network.check_unchecked(list(placed.values_list("node_id", flat=True)))
        for job_id, head in queue.behind.items():
            where = f"{head.workspace}'s queue" if ledger.enforced(head.pool) else "the queue"
            reasons[job_id] = f"Waits behind #{head.job_id} {head.name} in {where}"
        _keep_reasons(pending, reasons)
        if not waiting_for_room:
            _grow_elastic_jobs(ledger)


def _units(snap: Snapshot, plan: Plan) -> int:
    return len(plan.placements) * snap.job.units_per_node


def _no_room(snap: Snapshot, ask: Ask, ledger: Ledger) -> str:
    fitting = len(snap.fitting())
    where = f" in pool {ask.pool}" if ask.pool else ""
    if fitting >= snap.job.min_nodes:  # room enough, but not on nodes that reach each other
        return (
            f"Needs {snap.job.min_nodes} node(s) that reach each other; {fitting} have room, but the "
            f"network check failed between some of them: {'; '.join(snap.apart())}"
        )[:255]
    message = (
        f"Pool full{where}: needs {snap.job.min_nodes} node(s) with {snap.job.needs()} each, "
        f"{fitting} {'has' if fitting == 1 else 'have'} room"
    )
    if ledger.enforced(ask.pool) and not ledger.check(ask).reclaims:
        message += "; borrowing, so it reclaims nothing"
    return message[:255]


def _keep_reasons(pending: list[Job], reasons: dict[int, str]) -> None:
    """Store each pending job's reason where it changed (decisions run one at a time, so the
    rows read at the start of the pass are still the ones to write)."""
    changed = []
    for job in pending:
        reason = reasons.get(job.pk)
        if reason is not None and reason[:255] != job.wait_reason:
            job.wait_reason = reason[:255]
            changed.append(job)
    Job.objects.bulk_update(changed, ["wait_reason"], batch_size=REASONS_PER_UPDATE)


def _grow_elastic_jobs(ledger: Ledger) -> None:
    """Grow running elastic jobs toward their desired count, where the growth stays within
    their workspace's quota and borrowing limit (free capacity belongs to the queue first)."""
    candidates = Job.objects.filter(state=JobState.RUNNING).order_by("-priority", "created_at")
    for candidate in candidates.select_related("workspace", "pool"):
        if candidate.max_nodes == candidate.min_nodes and candidate.desired_nodes == candidate.min_nodes:
            continue  # rigid: nothing to grow (skips a view per rigid job)
        job = Job.lock(candidate.pk)
        view = job_view(job)
        if not (view.round_number and needs_growth(view)):
            continue
        pool = quotas.pool_name(job)
        extra = (job.desired_nodes - len(view.members)) * view.units_per_node
        if ledger.enforced(pool):
            grow = Ask(job.pk, job.workspace.name, pool, extra, job.priority, job.pk, job.name)
            if not ledger.check(grow).admissible:
                continue
        plan = change_membership(job, RoundReason.AUTOSCALE, snap=snapshot(job, view))
        if plan is not None and ledger.enforced(pool):
            ledger.charge(
                job.workspace.name, pool, (len(plan.placements) - len(view.members)) * view.units_per_node
            )


def _reclaim_for(job: Job, ask: Ask, snap: Snapshot, ledger: Ledger, shrink: bool) -> Snapshot:
    """Take ``job``'s workspace's quota back from borrowers of the pool: their elastic jobs
    shrink first, whole jobs are preempted (gracefully: they checkpoint, then requeue) only when
    that is not enough. Returns ``job``'s snapshot as it is then."""
    borrowers = [ws for ws in ledger.weights if ws != ask.workspace and ledger.borrowed(ws, ask.pool) > 0]
    if not borrowers:
        return snap
    holders = quotas.holders(ask.pool, borrowers)
    for give in reclaim(ledger, ask.workspace, ask.pool, snap.shortfall(), holders, shrink=shrink):
        victim = Job.lock(give.job_id)
        view = job_view(victim)
        plan = change_membership(
            victim,
            RoundReason.PREEMPTION,
            target=give.keep,
            for_job=job.name,
            reclaimed_by=ask.workspace,
            snap=snapshot(victim, view),
        )
        if plan is not None:
            snap = snap.after(view, plan)
            ledger.release(give.workspace, ask.pool, give.units)
    return snap


def _make_room_for(job: Job, snap: Snapshot) -> Snapshot:
    """Shrink lower-priority elastic jobs toward MIN so ``job`` fits; returns ``job``'s snapshot
    as it is then (what the shrunk jobs gave back is free)."""
    running = Job.objects.filter(state__in=RUNNING, priority__lt=job.priority).order_by(
        "priority", "-created_at"
    )
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
