"""The experiment pages: a comparison of jobs, the sweeps list, one sweep, the sweep form. They
read; changes go through the REST API (the pages call it), as on every other page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from console.core.roles import is_operator
from console.experiments import compare
from console.experiments.models import Sweep
from console.jobs.models import Job
from console.telemetry.downsample import series_names
from console.web.job_page import LOSS_NAME

SWEEPS_SHOWN = 100
# Buckets per job and chart: with ten lines on a chart about 560 pixels wide, more are not seen.
FIRST_CHART_POINTS = 300


def _ids(raw: str) -> list[int] | None:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return list(dict.fromkeys(int(p) for p in parts))[: compare.MAX_JOBS]


def _chosen(request: HttpRequest) -> tuple[list[Job], str, str]:
    """The jobs the page's query names, the query that names them again, and what went wrong."""
    visible = compare.visible_jobs(request.user).select_related("owner")
    if request.GET.get("jobs"):
        ids = _ids(request.GET["jobs"])
        if ids is None:
            return [], "", "Give job ids separated by commas, e.g. ?jobs=3,5,8."
        found = {job.pk: job for job in visible.filter(pk__in=ids)}
        missing = [str(i) for i in ids if i not in found]
        jobs = [found[i] for i in ids if i in found]
        error = f"No such job: {', '.join(missing)}." if missing else ""
        return jobs, urlencode({"jobs": ",".join(str(j.pk) for j in jobs)}), error
    if request.GET.get("name"):
        name = request.GET["name"][:128]
        jobs = list(
            visible.filter(name__pattern_prefix=name).order_by("created_at", "id")[: compare.MAX_JOBS]
        )
        return jobs, urlencode({"name": name}), "" if jobs else f"No job's name starts with {name!r}."
    if request.GET.get("sweep", "").isdigit():
        sweep = int(request.GET["sweep"])
        jobs = list(visible.filter(trial__sweep_id=sweep).order_by("trial__number")[: compare.MAX_JOBS])
        return jobs, urlencode({"sweep": sweep}), "" if jobs else f"Sweep {sweep} has no trials yet."
    return [], "", "Pick jobs to compare on the Jobs page (their checkboxes), or give ?jobs=3,5,8."


# Per-layer gradient norms (the SDK's grad_norm/<layer>): dozens of series the job page shows on
# demand only; the comparison's table still has them.
LAYER_PREFIX = "grad_norm/"


def _metric_order(names: set[str]) -> list[str]:
    """Losses first (the chart people look at first), then the rest by name; no per-layer norms."""
    names = {n for n in names if not n.startswith(LAYER_PREFIX)}
    return sorted(names, key=lambda n: (not (LOSS_NAME.search(n) and not n.startswith("grad")), n))


@login_required
def compare_page(request: HttpRequest) -> HttpResponse:
    jobs, query, error = _chosen(request)
    names: set[str] = set()
    for job in jobs:
        names.update(n for n in series_names(job.pk) if n not in compare.NOT_COMPARED)
    metrics = _metric_order(names)
    axis = "time" if request.GET.get("x") == "time" else "step"
    first_url = (
        f"/api/v1/compare/series/?{query}&"
        + urlencode({"metric": metrics[0], "points": FIRST_CHART_POINTS, "x": axis})
        if jobs and metrics
        else None
    )
    config: dict[str, Any] = {
        "query": query,
        "jobs": [compare.job_json(job) for job in jobs],
        "metrics": metrics,
        "x": axis,
        "from": request.GET.get("from"),
        "to": request.GET.get("to"),
        "first_url": first_url,
        "points": FIRST_CHART_POINTS,
    }
    return render(
        request,
        "experiments/compare.html",
        {"jobs": jobs, "config": config, "error": error, "first_url": first_url, "nav": "jobs"},
    )


@login_required
def sweep_list(request: HttpRequest) -> HttpResponse:
    sweeps = list(Sweep.objects.select_related("owner").order_by("-created_at", "-id")[:SWEEPS_SHOWN])
    return render(
        request,
        "experiments/sweeps.html",
        {"sweeps": sweeps, "can_operate": is_operator(request.user), "nav": "sweeps"},
    )


@login_required
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = get_object_or_404(Sweep.objects.select_related("owner"), pk=sweep_id)
    return render(
        request,
        "experiments/sweep.html",
        {"sweep": sweep, "can_operate": is_operator(request.user), "nav": "sweeps"},
    )


@login_required
def sweep_new(request: HttpRequest) -> HttpResponse:
    if not is_operator(request.user):
        raise PermissionDenied("Submitting sweeps needs the operator role.")
    from console.web.views import workload_catalog

    return render(request, "experiments/sweep_new.html", {"catalog": workload_catalog(), "nav": "sweeps"})
