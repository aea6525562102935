"""The quotas page and the dashboard's quota card: each pool's size, and each workspace's use,
nominal quota, borrowing and pending jobs there (aggregates only: every signed-in user may see
how the cluster is shared, not another workspace's jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.core.states import JobState
from console.jobs import quotas
from console.jobs.models import Job
from console.teams import access
from console.teams.models import NodePool, Resource, Workspace


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
    ledger = quotas.ledger()
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
    for name, pool in sorted(ledger.pools.items()):
        names = sorted(
            {
                *pool.quotas,
                *(ws for ws, p in ledger.used if p == name),
                *(ws for ws, p in pending if p == name),
            }
        )
        for workspace in names:
            quota = ledger.quota(workspace, name)
            rows.append(
                QuotaRow(
                    pool=name,
                    unit=units.get(name, "GPUs"),
                    capacity=pool.capacity,
                    workspace=workspace,
                    weight=weights.get(workspace, 1),
                    nominal=quota.nominal,
                    borrowing_limit=quota.borrowing_limit,
                    used=ledger.use(workspace, name),
                    borrowed=ledger.borrowed(workspace, name),
                    pending=pending.get((workspace, name), 0),
                    mine=workspace in mine,
                )
            )
    return rows


@login_required
def quotas_page(request: HttpRequest) -> HttpResponse:
    from console.web.nodes import pending_queue

    return render(
        request,
        "web/quotas.html",
        {"quotas": quota_rows(request.user), "queue": pending_queue(request.user), "nav": "quotas"},
    )
