"""Node page and queue data: what a node holds and held, and why each pending job waits.

The queue is read in the scheduler's order (console.jobs.scheduler.PENDING_ORDER: priority, then
submission time) and each job's wait explained from the views the scheduler plans by: the job's
own (console.jobs.snapshot.job_view: a parameter-server job's share of its processes, not
nproc_per_node) and the free capacity (node_views), computed once for the whole queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F

from console.cluster.models import NetworkCheck, Node, NodeLink
from console.cluster.network import failed_pairs, latest_check_of, links_of
from console.core.states import JobState
from console.jobs.models import Allocation, AllocationState, Job
from console.jobs.planning import Snapshot
from console.jobs.queries import attach_current_rounds
from console.jobs.scheduler import PENDING_ORDER
from console.jobs.snapshot import job_view, node_views
from console.teams import access
from console.telemetry.models import Event

QUEUE_SHOWN = 50
HISTORY_SHOWN = 20


@dataclass
class QueueEntry:
    job: Job
    position: int
    why: str


def pending_queue(user: Any = None) -> list[QueueEntry]:
    """Pending jobs in placement order (of the workspaces ``user`` sees; None: all), each with
    the reason it is not running yet: the scheduler's own (over quota, pool full, behind whom)
    when it gave one, else read from the free capacity."""
    queued = Job.objects.filter(state=JobState.PENDING).select_related("owner", "workspace", "pool")
    if user is not None:
        queued = access.visible(user, queued)
    jobs = list(queued.order_by(*PENDING_ORDER)[:QUEUE_SHOWN])
    if not jobs:
        return []
    nodes = node_views()
    apart = failed_pairs()
    attach_current_rounds(jobs)
    last_pending = {
        e.job_id: e.message
        for e in Event.objects.filter(job__in=jobs, kind="job.pending")
        .order_by("id")
        .only("job_id", "message")
    }
    entries = []
    blocked_by: Job | None = None
    for position, job in enumerate(jobs, start=1):
        view = Snapshot(job_view(job, job.current_round_cached), nodes, apart)  # type: ignore[attr-defined]
        fitting = len(view.fitting())
        if view.shortfall() and fitting >= job.min_nodes:
            why = (
                f"Needs {job.min_nodes} node(s) that reach each other; {fitting} have room, but the "
                f"network check failed between some of them: {'; '.join(view.apart())}."
            )
            blocked_by = blocked_by or job
        elif view.shortfall():
            why = (
                f"Needs {job.min_nodes} node(s) with {view.job.needs()} each; "
                f"{fitting} {'has' if fitting == 1 else 'have'} room now."
            )
            blocked_by = blocked_by or job
        elif blocked_by is not None:
            why = f"Fits, but waits behind #{blocked_by.pk} {blocked_by.name} (first in, first out within a priority)."
        else:
            why = f"Fits on {fitting} node(s); the scheduler places it on its next pass."
        if job.wait_reason:
            why = job.wait_reason + "."
        if job.pk in last_pending:
            why += f" Last note: {last_pending[job.pk]}"
        entries.append(QueueEntry(job, position, why))
    return entries


def node_context(node: Node) -> dict[str, Any]:
    """A node with what it holds now (current rounds of active jobs) and held before."""
    allocations = (
        Allocation.objects.filter(node=node).select_related("round__job").order_by("-round__created_at")
    )
    holding = list(
        allocations.filter(
            round__job__state__in=[s.value for s in JobState if s.is_active],
            round__number=F("round__job__round_number"),
            state__in=[AllocationState.ASSIGNED, AllocationState.RUNNING],
        )
    )
    held_ids = {a.pk for a in holding}
    history = [a for a in allocations[: HISTORY_SHOWN + len(held_ids)] if a.pk not in held_ids][
        :HISTORY_SHOWN
    ]
    gpus = list(node.gpus.all())
    check = latest_check_of(node)
    return {
        "links": links_of(node),
        "hosts": [{"node": node.name, "check": check, "result": check.results[node.name]}] if check else [],
        "node": node,
        "gpus": gpus,
        "holding": holding,
        "history": history,
        "slots_used": sum(a.nproc for a in holding if not a.gpu_indices),
        "gpus_used": sorted({i for a in holding for i in a.gpu_indices}),
    }


def network_context() -> dict[str, Any]:
    """The cluster network view: every link's latest word, each node's latest answer, recent checks."""
    links = list(NodeLink.objects.select_related("source", "target"))
    latest: dict[str, NetworkCheck] = {}
    for check in NetworkCheck.objects.filter(finished_at__isnull=False)[:200]:
        for name in check.results:
            latest.setdefault(name, check)
    hosts = [{"node": name, "check": c, "result": c.results[name]} for name, c in sorted(latest.items())]
    return {
        "links": links,
        "failed_count": sum(1 for link in links if not link.ok),
        "hosts": hosts,
        "checks": list(NetworkCheck.objects.all()[:20]),
    }
