"""Server-rendered pages of the console. They read; every change goes through the REST API
(the pages call it with fetch), so the API stays the one door that checks roles and states."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from console.cluster.models import Gpu, Node
from console.core.roles import is_operator
from console.core.states import JobState, NodeState
from console.jobs.models import Allocation, Job, Precision, Round, Strategy, job_summary
from console.telemetry.events import event_payload, node_payload
from console.telemetry.models import Event, Metric

JOBS_PER_PAGE = 25
# A chart on a page is a few hundred pixels wide; more points than this only cost bandwidth.
CHART_POINTS = 400
EVENTS_SHOWN = 100
ROUNDS_SHOWN = 20


def _job_rows(request: HttpRequest, jobs: QuerySet[Job]) -> Page:
    current_world = Round.objects.filter(job=OuterRef("pk"), number=OuterRef("round_number")).values(
        "world_size"
    )
    paginator = Paginator(
        jobs.select_related("owner").annotate(world_size=Subquery(current_world[:1])), JOBS_PER_PAGE
    )
    return paginator.get_page(request.GET.get("page"))


def _nodes() -> QuerySet[Node]:
    return Node.objects.prefetch_related("gpus").order_by("name")


def cluster_summary() -> dict[str, Any]:
    node_counts = dict(Node.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    job_counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    gpu_models = Counter(Gpu.objects.values_list("name", flat=True))
    return {
        "nodes_by_state": [(s.value, node_counts.get(s.value, 0)) for s in NodeState],
        "nodes_total": sum(node_counts.values()),
        "jobs_by_state": [(s.value, job_counts.get(s.value, 0)) for s in JobState],
        "jobs_total": sum(job_counts.values()),
        "gpus_total": sum(gpu_models.values()),
        "gpu_models": sorted(gpu_models.items()),
    }


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    jobs = Job.objects.all()
    return render(
        request,
        "web/dashboard.html",
        {
            "summary": cluster_summary(),
            "page": _job_rows(request, jobs),
            "nodes": _nodes(),
            "nav": "dashboard",
        },
    )


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = Job.objects.all()
    state = request.GET.get("state", "")
    if state in JobState.values:
        jobs = jobs.filter(state=state)
    query = request.GET.get("q", "").strip()
    if query:
        jobs = jobs.filter(name__icontains=query)
    return render(
        request,
        "web/jobs.html",
        {
            "page": _job_rows(request, jobs),
            "states": JobState.values,
            "state": state,
            "q": query,
            "nav": "jobs",
        },
    )


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "web/nodes.html",
        {
            "nodes": _nodes(),
            "summary": cluster_summary(),
            "node_actions": is_operator(request.user),
            "nav": "nodes",
        },
    )


def loss_series(job: Job) -> dict[str, list[list[float]]]:
    """Display-sized loss series, from rank 0 (every rank logs the same loss in DDP)."""
    rows = Metric.objects.filter(job=job, rank=0, name__contains="loss")
    series: dict[str, list[list[float]]] = {}
    for name, step, value in rows.order_by("step", "round_number").values_list("name", "step", "value"):
        series.setdefault(name, []).append([step, value])
    for name, points in series.items():
        if len(points) > CHART_POINTS:
            stride = -(-len(points) // CHART_POINTS)
            series[name] = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
    return series


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.select_related("owner", "bundle"), pk=job_id)
    rounds = list(
        Round.objects.filter(job=job)
        .order_by("-number")
        .prefetch_related(Prefetch("allocations", queryset=Allocation.objects.select_related("node")))[
            :ROUNDS_SHOWN
        ]
    )
    events = list(Event.objects.filter(job=job).select_related("node").order_by("-id")[:EVENTS_SHOWN])
    events.reverse()
    current = next((r for r in rounds if r.number == job.round_number), None)
    return render(
        request,
        "web/job_detail.html",
        {
            "job": job,
            "rounds": rounds,
            "current_round": current,
            "events": events,
            "last_seq": events[-1].pk if events else 0,
            "series": loss_series(job),
            "can_operate": is_operator(request.user),
            "terminal": job.job_state.is_terminal,
            "nav": "jobs",
        },
    )


def workload_catalog() -> dict[str, dict[str, Any]]:
    """The built-in workloads with their default hyperparameters, for the submit form."""
    try:
        from workers.workloads.catalog import WORKLOADS
    except ImportError:
        return {}
    catalog: dict[str, dict[str, Any]] = {}
    for name, info in WORKLOADS.items():
        specs = getattr(info, "hyperparameters", {}) or {}
        catalog[str(name)] = {
            "description": str(getattr(info, "description", "")),
            "hyperparameters": info.defaults(),
            "help": {key: str(getattr(spec, "help", "")) for key, spec in specs.items()},
        }
    return catalog


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    if not is_operator(request.user):
        raise PermissionDenied("Submitting jobs needs the operator role.")
    return render(
        request,
        "web/job_submit.html",
        {
            "catalog": workload_catalog(),
            "precisions": Precision.values,
            "strategies": [s for s in Strategy.values if s != Strategy.PARAMETER_SERVER],  # not available yet
            "nav": "submit",
        },
    )


@login_required
def job_live(request: HttpRequest, job_id: int) -> JsonResponse:
    """What the job page polls when its websocket is unavailable."""
    job = get_object_or_404(Job, pk=job_id)
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        after = 0
    events = Event.objects.filter(job=job, id__gt=after).select_related("node").order_by("id")[:EVENTS_SHOWN]
    summary = job_summary(job)
    current = job.current_round()
    summary["world_size"] = current.world_size if current else 0
    return JsonResponse(
        {
            "job": summary,
            "events": [event_payload(e) for e in events],
            "series": loss_series(job),
        }
    )


@login_required
def cluster_live(request: HttpRequest) -> JsonResponse:
    """What the dashboard polls when its websocket is unavailable."""
    jobs = Job.objects.filter(state__in=[s.value for s in JobState if not s.is_terminal])[:200]
    return JsonResponse(
        {
            "nodes": [node_payload(n) for n in _nodes()],
            "jobs": [job_summary(j) for j in jobs],
            "summary": cluster_summary(),
        }
    )
