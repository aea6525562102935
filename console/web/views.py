"""Server-rendered pages of the console. They read; every change goes through the REST API
(the pages call it with fetch), so the API stays the one door that checks roles and states."""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from console.api.pagination import decode_cursor, encode_cursor, key_of, keyset_page
from console.cluster.models import Gpu, Node
from console.core.roles import is_operator
from console.core.states import JobState, NodeState
from console.jobs.failures import launch_reason
from console.jobs.models import Allocation, Bundle, Job, Precision, Round, Strategy, job_summary
from console.jobs.parameter_server import role_rows
from console.jobs.queries import DEFAULT_SORT, SORTS, filter_jobs, job_ordering
from console.teams import access
from console.teams.models import Role, Workspace
from console.telemetry import goodput_data
from console.telemetry.api import log_line_json
from console.telemetry.events import event_payload, node_payload
from console.telemetry.models import Event, LogLine
from console.web.job_page import page_config
from console.web.nodes import network_context, node_context, pending_queue
from console.web.quotas import quota_rows
from console.web.trackers import tracker_links

JOBS_PER_PAGE = 25
EVENTS_SHOWN = 100
ROUNDS_SHOWN = 20
# Log lines per poll when the websocket is down (the page polls every few seconds).
POLL_LOG_LINES = 2000
RECENT_BUNDLES = 20


def _with_world_size(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """Each job's current world size, in the same query (no query per row)."""
    current_world = Round.objects.filter(job=OuterRef("pk"), number=OuterRef("round_number")).values(
        "world_size"
    )
    return jobs.annotate(world_size=Subquery(current_world[:1]))


def _recent_jobs(user: Any) -> list[Job]:
    jobs = access.visible(user, Job.objects.select_related("owner", "workspace"))
    return list(_with_world_size(jobs).order_by("-created_at", "-id")[:JOBS_PER_PAGE])


def _nodes() -> QuerySet[Node]:
    return Node.objects.prefetch_related("gpus").order_by("name")


def cluster_summary(user: Any) -> dict[str, Any]:
    """Nodes and GPUs of the whole cluster; jobs of the workspaces ``user`` sees."""
    node_counts = dict(Node.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    job_counts = dict(
        access.visible(user, Job.objects.all())
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    gpu_models = Counter(Gpu.objects.values_list("name", flat=True))
    return {
        "nodes_by_state": [(s.value, node_counts.get(s.value, 0)) for s in NodeState],
        "nodes_total": sum(node_counts.values()),
        "jobs_by_state": [(s.value, job_counts.get(s.value, 0)) for s in JobState],
        "jobs_total": sum(job_counts.values()),
        "gpus_total": sum(gpu_models.values()),
        "gpu_models": sorted(gpu_models.items()),
    }


def cluster_goodput() -> list[dict[str, Any]]:
    """The dashboard's goodput card: each window's figure and its largest badput buckets."""
    rows = []
    for name, seconds in goodput_data.WINDOWS.items():
        figure = goodput_data.cluster_goodput(seconds)
        spent = figure["seconds"]
        assert isinstance(spent, dict)
        wall = float(figure["wall_seconds"])  # type: ignore[arg-type]
        worst = sorted(((v, k) for k, v in spent.items() if k != "productive" and v > 0), reverse=True)[:3]
        rows.append(
            {
                "window": name,
                "percent": None if figure["goodput"] is None else round(100 * float(figure["goodput"]), 1),  # type: ignore[arg-type]
                "jobs": figure["jobs"],
                "badput": [(k, round(100 * v / wall, 1)) for v, k in worst] if wall else [],
            }
        )
    return rows


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "web/dashboard.html",
        {
            "summary": cluster_summary(request.user),
            "goodput": cluster_goodput(),
            "jobs": _recent_jobs(request.user),
            "nodes": _nodes(),
            "queue": pending_queue(request.user),
            "quotas": quota_rows(request.user),
            "node_actions": is_operator(request.user),
            "nav": "dashboard",
        },
    )


# The jobs list's sortable columns: (label, ascending sort, descending sort), sorts of
# console/jobs/queries.py. "Age" ascending is the newest first.
SORTABLE_COLUMNS = {
    "name": ("Name", "name", "-name"),
    "priority": ("Priority", "priority", "-priority"),
    "age": ("Age", "-created_at", "created_at"),
}
JOB_LIST_PARAMS = ("state", "owner", "name", "sort")
SORT_LABELS = {
    "-created_at": "Newest first",
    "created_at": "Oldest first",
    "-id": "Highest id first",
    "id": "Lowest id first",
    "name": "Name, A to Z",
    "-name": "Name, Z to A",
    "-priority": "Highest priority first",
    "priority": "Lowest priority first",
}


def _list_url(params: dict[str, str], **changes: str) -> str:
    wanted = {k: v for k, v in {**params, **changes}.items() if v}
    return "?" + urlencode(wanted) if wanted else "?"


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """Jobs filtered by state, owner and name prefix, in any sort order of the API, a page at a
    time by cursor (console/api/pagination.py): the same queries whatever the page or list size."""
    params = {key: request.GET.get(key, "").strip() for key in JOB_LIST_PARAMS}
    found = filter_jobs(params, _with_world_size(access.visible(request.user, Job.objects.all())))
    errors: dict[str, list[str]] = {}
    jobs: list[Job] = []
    has_next = has_previous = False
    if found.is_valid():
        sort = job_ordering(params)
        cursor = None
        raw = request.GET.get("cursor", "")
        if raw:
            try:
                cursor = decode_cursor(raw, sort, Job)
            except ValueError:
                errors["cursor"] = [
                    "That page link is out of date (the sort order changed); here is the first page."
                ]
        jobs, has_next, has_previous = keyset_page(found.qs, sort, cursor, JOBS_PER_PAGE)
    else:
        errors = {field: list(messages) for field, messages in found.errors.items()}
    sort_key = params["sort"] or DEFAULT_SORT
    columns = {}
    for column, (label, ascending, descending) in SORTABLE_COLUMNS.items():
        direction = "ascending" if sort_key == ascending else "descending" if sort_key == descending else ""
        columns[column] = {
            "label": label,
            "aria_sort": direction,
            "url": _list_url(params, sort=descending if direction == "ascending" else ascending),
        }
    sort = job_ordering(params)
    return render(
        request,
        "web/jobs.html",
        {
            "jobs": jobs,
            "params": params,
            "errors": errors,
            "states": JobState.values,
            "sorts": [(key, SORT_LABELS.get(key, key)) for key in SORTS],
            "sort_key": sort_key,
            "columns": columns,
            "next_url": _list_url(params, cursor=encode_cursor(sort, key_of(sort, jobs[-1])))
            if has_next and jobs
            else "",
            "previous_url": _list_url(
                params, cursor=encode_cursor(sort, key_of(sort, jobs[0]), backwards=True)
            )
            if has_previous and jobs
            else "",
            "first_url": _list_url(params) if has_previous else "",
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
            "summary": cluster_summary(request.user),
            "node_actions": is_operator(request.user),
            "nav": "nodes",
        },
    )


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(
        access.visible(request.user, Job.objects.select_related("owner", "bundle", "workspace")), pk=job_id
    )
    rounds = list(
        Round.objects.filter(job=job)
        .order_by("-number")
        .prefetch_related(Prefetch("allocations", queryset=Allocation.objects.select_related("node")))[
            :ROUNDS_SHOWN
        ]
    )
    current = next((r for r in rounds if r.number == job.round_number), None)
    config = page_config(job)
    widest = max((r.world_size for r in rounds), default=0)
    return render(
        request,
        "web/job_detail.html",
        {
            "job": job,
            "rounds": rounds,
            "current_round": current,
            "config": config,
            "has_layers": any(n.startswith("grad_norm/") for n in config["names"]),
            "rank_choices": range(widest),
            "role_rows": role_rows(job, current) if job.is_parameter_server else [],
            "launch_failure": launch_failure(job, rounds),
            "can_operate": access.may(request.user, job.workspace_id, Role.EDITOR),
            "terminal": job.job_state.is_terminal,
            "trackers": tracker_links(job),
            "nav": "jobs",
        },
    )


def launch_failure(job: Job, rounds: list[Round]) -> dict[str, Any] | None:
    """A live job's latest launch failure (console/jobs/backoff.py: its ranks never started, or
    never reached their peers) in its last two rounds, with its reason, for the page's banner."""
    if job.job_state.is_terminal:
        return None
    for rnd in rounds[:2]:
        if rnd.failure.get("launch"):
            return {**rnd.failure, "reason": launch_reason(rnd.failure)}
    return None


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
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node.objects.prefetch_related("gpus"), name=name)
    return render(
        request,
        "web/node_detail.html",
        {**node_context(node), "node_actions": is_operator(request.user), "nav": "nodes"},
    )


@login_required
def network_view(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "web/network.html",
        {**network_context(), "node_actions": is_operator(request.user), "nav": "nodes"},
    )


@login_required
def api_docs(request: HttpRequest) -> HttpResponse:
    """Swagger UI for /api/schema/, served from the console (drf-spectacular-sidecar)."""
    return render(request, "web/api_docs.html", {"nav": "api"})


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    if not access.acts_anywhere(request.user):
        raise PermissionDenied("Submitting jobs needs the editor role in a workspace.")
    return render(
        request,
        "web/job_submit.html",
        {
            "catalog": workload_catalog(),
            "bundles": access.visible(request.user, Bundle.objects.select_related("owner"), "workspaces")
            .distinct()
            .order_by("-created_at")[:RECENT_BUNDLES],
            "workspaces": Workspace.objects.filter(pk__in=access.editable_workspaces(request.user)),
            "precisions": Precision.values,
            "strategies": Strategy.values,
            "nav": "submit",
        },
    )


@login_required
def job_live(request: HttpRequest, job_id: int) -> JsonResponse:
    """What the job page polls when its websocket is unavailable: state, events after ``after``,
    log lines after ``log_after`` (metrics it fetches by range from the metrics API)."""
    job = get_object_or_404(access.visible(request.user, Job.objects.all()), pk=job_id)
    after = _int_param(request, "after")
    log_after = _int_param(request, "log_after")
    events = Event.objects.filter(job=job, id__gt=after).select_related("node").order_by("id")[:EVENTS_SHOWN]
    lines = LogLine.objects.filter(job=job, id__gt=log_after).order_by("id")[:POLL_LOG_LINES]
    summary = job_summary(job)
    current = job.current_round()
    summary["world_size"] = current.world_size if current else 0
    return JsonResponse(
        {
            "job": summary,
            "events": [event_payload(e) for e in events],
            "logs": [log_line_json(line) for line in lines],
        }
    )


def _int_param(request: HttpRequest, name: str) -> int:
    try:
        return max(0, int(request.GET.get(name, "0")))
    except ValueError:
        return 0


@login_required
def cluster_live(request: HttpRequest) -> JsonResponse:
    """What the dashboard polls when its websocket is unavailable."""
    jobs = access.visible(
        request.user, Job.objects.filter(state__in=[s.value for s in JobState if not s.is_terminal])
    )[:200]
    return JsonResponse(
        {
            "nodes": [node_payload(n) for n in _nodes()],
            "jobs": [job_summary(j) for j in jobs],
            "summary": cluster_summary(request.user),
        }
    )
