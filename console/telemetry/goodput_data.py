"""Reads what goodput needs (console/telemetry/goodput.py) for one job or many, in a fixed number
of queries however many jobs: rounds, the metric tiles' step bounds per round (first and last
step time, last step, the SDK's step time and data wait), checkpoints' blocking, ``job.hang``
events. A round's first step number is read only where steps may have been redone (a round after
a failure), from its first tile and then a bounded raw read.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db.models import Max, Min, Q, Sum

from console.core.states import JobState
from console.jobs.models import Checkpoint, Job, Round
from console.telemetry import goodput
from console.telemetry.models import ROLLUP_STEPS, Event, Metric, MetricRollup

HANG_EVENT = "job.hang"
STEP_TIME = "step_time_s"
DATA_WAIT = "data_wait_s"
# Series whose points mark steps: every script logs loss, the SDK's step timer the rest.
STEP_SERIES = ("loss", STEP_TIME, "samples_per_s", "grad_norm", DATA_WAIT)
WINDOWS = {"day": 86400.0, "week": 7 * 86400.0}


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _first_step(job_id: int, number: int) -> int | None:
    for name in STEP_SERIES:
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
                job_id=job_id, name=name, round_number=number, step__gte=tile, step__lt=tile + ROLLUP_STEPS
            )
            .order_by("step")
            .values_list("step", flat=True)
            .first()
        )
        return int(step if step is not None else tile)
    return None


def timelines(jobs: Iterable[Job], now: float | None = None) -> dict[int, goodput.Timeline]:
    now = time.time() if now is None else now
    by_id = {job.pk: job for job in jobs}
    ids = list(by_id)
    if not ids:
        return {}
    bounds: dict[tuple[int, int], dict[str, Any]] = {
        (row["job_id"], row["round_number"]): dict(row)
        for row in MetricRollup.objects.filter(job_id__in=ids, name__in=STEP_SERIES)
        .values("job_id", "round_number")
        .annotate(
            first_time=Min("first_time"),
            last_time=Max("last_time"),
            last_step=Max("last_step"),
            step_total=Sum("total", filter=Q(name=STEP_TIME)),
            step_count=Sum("count", filter=Q(name=STEP_TIME)),
            wait_total=Sum("total", filter=Q(name=DATA_WAIT)),
            wait_count=Sum("count", filter=Q(name=DATA_WAIT)),
        )
    }
    rounds: dict[int, list[Round]] = defaultdict(list)
    for rnd in Round.objects.filter(job_id__in=ids).order_by("job_id", "number"):
        rounds[rnd.job_id].append(rnd)
    checkpoints: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for job_id, at, blocking_ms in Checkpoint.objects.filter(job_id__in=ids, blocking_ms__gt=0).values_list(
        "job_id", "created_at", "blocking_ms"
    ):
        checkpoints[job_id].append((at.timestamp(), blocking_ms / 1000.0))
    hangs: dict[int, list[goodput.Hang]] = defaultdict(list)
    for job_id, number, at, data in Event.objects.filter(job_id__in=ids, kind=HANG_EVENT).values_list(
        "job_id", "round_number", "created_at", "data"
    ):
        since = data.get("since") if isinstance(data, dict) else None
        hangs[job_id].append(
            goodput.Hang(
                round_number=number or 0,
                at=at.timestamp(),
                since=float(since) if isinstance(since, int | float) else None,
            )
        )
    out = {}
    for job_id, job in by_id.items():
        facts = []
        for rnd in rounds[job_id]:
            row = bounds.get((job_id, rnd.number), {})
            step_seconds = row["step_total"] / row["step_count"] if row.get("step_count") else None
            wait = row["wait_total"] / row["wait_count"] if row.get("wait_count") else 0.0
            share = min(1.0, max(0.0, wait / step_seconds)) if step_seconds else 0.0
            first_step = (
                _first_step(job_id, rnd.number) if row and rnd.reason in goodput.REDO_REASONS else None
            )
            facts.append(
                goodput.RoundFacts(
                    number=rnd.number,
                    reason=rnd.reason,
                    created=rnd.created_at.timestamp(),
                    ended=_ts(rnd.ended_at),
                    outcome=rnd.outcome,
                    failed=_ts(rnd.failed_at),
                    first_step=first_step,
                    first_step_time=_ts(row.get("first_time")),
                    last_step=row.get("last_step"),
                    last_step_time=_ts(row.get("last_time")),
                    step_seconds=step_seconds,
                    data_share=share,
                    world_size=rnd.world_size,
                )
            )
        out[job_id] = goodput.Timeline(
            created=job.created_at.timestamp(),
            now=now,
            finished=_ts(job.finished_at),
            running=job.state == JobState.RUNNING,
            rounds=tuple(facts),
            checkpoints=tuple(checkpoints[job_id]),
            hangs=tuple(hangs[job_id]),
        )
    return out


def job_goodput(job: Job, now: float | None = None) -> goodput.Goodput:
    return goodput.compute(timelines([job], now)[job.pk])


def cluster_goodput(window_seconds: float, now: float | None = None) -> dict[str, object]:
    """Every job's goodput within the last ``window_seconds``, summed."""
    now = time.time() if now is None else now
    since = now - window_seconds
    jobs = Job.objects.filter(
        Q(finished_at__isnull=True) | Q(finished_at__gt=datetime.fromtimestamp(since, tz=UTC))
    )
    parts = [goodput.compute(t).clipped(since, now) for t in timelines(jobs, now).values()]
    body = goodput.combine(parts)
    body["window_seconds"] = window_seconds
    return body
