"""Reads what the quota decisions need from the database: each pool's size, each workspace's
quota and use, pending jobs as ``Ask``s and running ones as ``Holder``s, and the rows the quotas
page, the dashboard and ``GET /api/v1/quotas/`` show
(console/teams/fairshare.py and console/teams/reclaim.py decide; this only reads).

A job's units are what quotas count of it: GPUs for a GPU job, CPU slots for a CPU job, at its
current size (running) or its minimum (pending). A job with no pool counts in no quota.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count

from console.cluster.models import Gpu, Node
from console.core.states import JobState, NodeState
from console.jobs.models import Job
from console.jobs.snapshot import labels, live_allocations
from console.teams import access
from console.teams.fairshare import Ask, Ledger, PoolView, QuotaView
from console.teams.models import NodePool, Quota, Resource, Workspace
from console.teams.reclaim import Holder

ACTIVE = [s.value for s in JobState if s.is_active]


def units_per_node(job: Job) -> int:
    """GPUs (a GPU job) or CPU slots of one node's share (a parameter-server job's share of its
    processes), as console/jobs/plans.py's JobView.units_per_node counts them."""
    if job.gpus_per_proc:
        return job.nproc_per_node * job.gpus_per_proc
    if job.is_parameter_server:
        total = 1 + job.role_count("ps") + job.role_count("worker")
        return -(-total // max(1, job.desired_nodes))
    return job.nproc_per_node


def pool_name(job: Job) -> str:
    return job.pool.name if job.pool_id and job.pool is not None else ""


def ask_of(job: Job) -> Ask:
    return Ask(
        job_id=job.pk,
        workspace=job.workspace.name,
        pool=pool_name(job),
        units=job.min_nodes * units_per_node(job),
        priority=job.priority,
        order=job.pk,
        name=job.name,
    )


def pool_views() -> list[PoolView]:
    """Every pool with its size now (nodes that take work and match its selector) and quotas."""
    pools = list(NodePool.objects.all())
    nodes = list(Node.objects.filter(state=NodeState.ONLINE).values_list("pk", "slots", "labels"))
    gpus: dict[int, int] = defaultdict(int)
    for node_id in Gpu.objects.filter(node__state=NodeState.ONLINE).values_list("node_id", flat=True):
        gpus[node_id] += 1
    quotas: dict[int, dict[str, QuotaView]] = defaultdict(dict)
    for pool_id, workspace, nominal, limit in Quota.objects.values_list(
        "pool_id", "workspace__name", "nominal", "borrowing_limit"
    ):
        quotas[pool_id][workspace] = QuotaView(nominal, limit)
    views = []
    for pool in pools:
        wanted = labels(pool.selector or {})
        members = [(pk, slots) for pk, slots, node_labels in nodes if wanted <= labels(node_labels or {})]
        if pool.resource == Resource.GPU:
            capacity = sum(gpus[pk] for pk, _ in members)
        else:
            capacity = sum(slots for _, slots in members)
        views.append(PoolView(pool.name, capacity, quotas[pool.pk]))
    return views


def usage() -> dict[tuple[str, str], int]:
    """(workspace, pool) -> units the live rounds of its jobs hold."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    rows = live_allocations().values_list(
        "round__job__workspace__name",
        "round__job__pool__name",
        "round__job__gpus_per_proc",
        "gpu_indices",
        "nproc",
    )
    for workspace, pool, gpus_per_proc, gpu_indices, nproc in rows:
        if pool:
            used[(workspace, pool)] += len(gpu_indices) if gpus_per_proc else nproc
    return dict(used)


def ledger() -> Ledger:
    weights = dict(Workspace.objects.values_list("name", "weight"))
    return Ledger(pool_views(), usage(), weights)


def holders(pool: str, workspaces: Iterable[str]) -> list[Holder]:
    """The running jobs of ``workspaces`` in ``pool``, with their current node counts."""
    found: dict[int, Holder] = {}
    rows = (
        live_allocations()
        .filter(round__job__pool__name=pool, round__job__workspace__name__in=list(workspaces))
        .filter(round__job__state__in=[JobState.RUNNING, JobState.STARTING, JobState.RESIZING])
        .select_related("round__job__workspace", "round__job__pool")
    )
    counts: dict[int, int] = defaultdict(int)
    jobs: dict[int, Job] = {}
    for alloc in rows:
        counts[alloc.round.job_id] += 1
        jobs[alloc.round.job_id] = alloc.round.job
    for job_id, job in jobs.items():
        found[job_id] = Holder(
            job_id=job_id,
            workspace=job.workspace.name,
            pool=pool,
            nodes=counts[job_id],
            min_nodes=job.min_nodes,
            units_per_node=units_per_node(job),
            priority=job.priority,
            order=job_id,
        )
    return list(found.values())


@dataclass(frozen=True)
class QuotaRow:
    pool: str
    unit: str
    capacity: int
    workspace: str
    weight: int
    nominal: int
    borrowing_limit: int | None
    used: int
    borrowed: int
    pending: int
    mine: bool  # the viewer belongs to it

    @property
    def used_pct(self) -> int:
        return round(100 * self.used / self.capacity) if self.capacity else 0

    @property
    def nominal_pct(self) -> int:
        return round(100 * self.nominal / self.capacity) if self.capacity else 0


def quota_rows(user: Any) -> list[QuotaRow]:
    """One row per pool and workspace with a quota there (or use of it), pool by pool."""
    book = ledger()
    weights = dict(Workspace.objects.values_list("name", "weight"))
    units = {p.name: ("GPUs" if p.resource == Resource.GPU else "CPU slots") for p in NodePool.objects.all()}
    pending: dict[tuple[str, str], int] = {}
    counts = (
        Job.objects.filter(state=JobState.PENDING, pool__isnull=False)
        .values_list("workspace__name", "pool__name")
        .annotate(n=Count("id"))
    )
    for workspace, pool, n in counts:
        pending[(workspace, pool)] = n
    mine = set(Workspace.objects.filter(pk__in=list(access.roles(user))).values_list("name", flat=True))
    rows = []
    for name, pool in sorted(book.pools.items()):
        names = sorted(
            {
                *pool.quotas,
                *(ws for ws, p in book.used if p == name),
                *(ws for ws, p in pending if p == name),
            }
        )
        for workspace in names:
            quota = book.quota(workspace, name)
            rows.append(
                QuotaRow(
                    pool=name,
                    unit=units.get(name, "GPUs"),
                    capacity=pool.capacity,
                    workspace=workspace,
                    weight=weights.get(workspace, 1),
                    nominal=quota.nominal,
                    borrowing_limit=quota.borrowing_limit,
                    used=book.use(workspace, name),
                    borrowed=book.borrowed(workspace, name),
                    pending=pending.get((workspace, name), 0),
                    mine=workspace in mine,
                )
            )
    return rows
