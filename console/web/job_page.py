"""What the job page needs on first paint, beyond the job itself: the metric names to chart,
where each round began on the step axis, the script's own progress total, recent events.

All of it comes from indexes (metric names from the tiles' skip scan, a round's first step from
its first tile and then a bounded raw read), so a job with a million points opens as fast as a
fresh one; the charts then load their history from the metrics API.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from console.jobs import progress
from console.jobs.models import Job, Round
from console.telemetry.downsample import series_names
from console.telemetry.events import event_payload
from console.telemetry.models import ROLLUP_STEPS, Event, Metric, MetricRollup

EVENTS_SHOWN = 300
# The series whose first step marks a round (every script logs loss; the SDK's step timer
# reports step time). Tried in order.
BOUNDARY_SERIES = ("loss", "step_time_s", "samples_per_s", "grad_norm")
# Logged at step 0 whatever the step (sdk.progress): never a round's first step.
NOT_A_STEP = {"total_steps"}
TOTAL_STEPS = "total_steps"


def _first_step(job_id: int, number: int, names: list[str]) -> int | None:
    """The first step a round logged: its first tile bounds the raw read from below."""
    stepped = [n for n in names if n not in NOT_A_STEP]
    for name in [n for n in BOUNDARY_SERIES if n in names] or stepped[:1]:
        tile = (
            MetricRollup.objects.filter(job_id=job_id, name=name, round_number=number)
            .order_by("bucket_step")
            .values_list("bucket_step", flat=True)
            .first()
        )
        if tile is None:
            continue
        step = (
            Metric.objects.filter(
                job_id=job_id,
                name=name,
                step__gte=tile,
                step__lt=tile + ROLLUP_STEPS,
                round_number=number,
            )
            .order_by("step")
            .values_list("step", flat=True)
            .first()
        )
        return int(step if step is not None else tile)
    return None


def round_boundaries(job: Job, names: list[str]) -> list[dict[str, Any]]:
    """Every round after the first, at the step where its points begin (rounds that never
    reached a step have no place on a step axis and are left out)."""
    boundaries = []
    for rnd in Round.objects.filter(job=job, number__gt=1).order_by("number"):
        step = _first_step(job.pk, rnd.number, names)
        if step is not None:
            boundaries.append(
                {"round": rnd.number, "step": step, "reason": rnd.reason, "world": rnd.world_size}
            )
    return boundaries


def progress_total(job: Job, names: list[str]) -> int | None:
    """The script's own total: ``sdk.progress(total)`` (the ``total_steps`` metric), else what
    the controller recorded, else the ``steps`` hyperparameter."""
    if TOTAL_STEPS in names:
        value = (
            Metric.objects.filter(job=job, name=TOTAL_STEPS)
            .order_by("-step", "-id")
            .values_list("value", flat=True)
            .first()
        )
        if value is None:  # raw points past retention: the newest tile still has it
            value = (
                MetricRollup.objects.filter(job=job, name=TOTAL_STEPS)
                .order_by("-bucket_step")
                .values_list("max_value", flat=True)
                .first()
            )
        if value is not None and value > 0:
            return int(value)
    for key in ("total_steps", "total"):
        if isinstance(job.progress.get(key), int):
            return int(job.progress[key])
    steps = job.hyperparameters.get("steps")
    return steps if isinstance(steps, int) and steps > 0 else None


def recent_events(job: Job) -> list[dict[str, Any]]:
    events = list(Event.objects.filter(job=job).select_related("node").order_by("-id")[:EVENTS_SHOWN])
    return [event_payload(e) for e in reversed(events)]


# The loss chart's series (the page's first chart): train and eval losses. The browser's
# classification (frontend/src/jobcharts.js) puts the same names on its loss chart.
LOSS_NAME = re.compile(r"(^|[_/])loss$")
FIRST_CHART_POINTS = 600


def first_chart_url(job: Job, names: list[str]) -> str | None:
    """The metrics query of the loss chart, which the page preloads while its script loads."""
    losses = [n for n in names if LOSS_NAME.search(n) and not n.startswith("grad")]
    if not losses:
        return None
    query = urlencode({"name": ",".join(losses), "points": FIRST_CHART_POINTS})
    return f"/api/v1/jobs/{job.pk}/metrics/?{query}"


def page_config(job: Job) -> dict[str, Any]:
    names = series_names(job.pk)
    return {
        "first_url": first_chart_url(job, names),
        "id": job.pk,
        "state": job.state,
        "round": job.round_number,
        "restarts": job.restarts,
        "progress": job.progress,
        "names": names,
        "boundaries": round_boundaries(job, names),
        # A parameter-server job counts examples (or shards), not steps: the script's step total
        # is not its progress (console/jobs/progress.py).
        "total_steps": None if job.is_parameter_server else progress_total(job, names),
        "progress_unit": progress.EXAMPLES if job.is_parameter_server else progress.STEPS,
        # Its role series (ps_*, worker_*, queue_*) go on the role charts, not one chart each.
        "parameter_server": job.is_parameter_server,
        "events": recent_events(job),
    }
