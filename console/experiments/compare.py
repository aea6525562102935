"""Comparing jobs: which jobs (by id, name prefix or sweep), the hyperparameters where they
differ, and each metric's final and best value per job. Read from indexes only: the tiles ingest
keeps (console/telemetry/models.py MetricRollup) give every series' extremes and last step in one
pass, then one bounded raw read per series finds the exact points, so ten jobs of a million
points each compare as fast as ten fresh ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from console.jobs.models import Job
from console.teams import access
from console.telemetry.downsample import finite_or_none

MAX_JOBS = 50
# Not a signal of training: the script's progress total.
NOT_COMPARED = {"total_steps"}
# Metrics where higher is better; every other metric is best at its lowest (losses, times).
HIGHER_IS_BETTER = re.compile(
    r"(^|[_/])(acc|accuracy|auc|f1|precision|recall|score|reward|samples_per_s|tokens_per_s|throughput|"
    r"examples_per_s|map|bleu|rouge)($|[_/])",
    re.IGNORECASE,
)
# Spec fields compared beside the hyperparameters (a difference there explains a difference too).
SPEC_FIELDS = ("workload", "entrypoint", "args", "nnodes", "nproc_per_node", "precision", "grad_accum_steps")


def visible_jobs(user: Any) -> QuerySet[Job]:
    """The jobs ``user`` may see: those of the workspaces they belong to (site admins: all)."""
    if not getattr(user, "is_authenticated", False):
        return Job.objects.none()
    return access.visible(user, Job.objects.all())


def higher_is_better(name: str) -> bool:
    return bool(HIGHER_IS_BETTER.search(name))


@dataclass(frozen=True)
class Stat:
    final: float | None
    final_step: int | None
    best: float | None
    best_step: int | None
    points: int

    def as_json(self) -> dict[str, Any]:
        return {
            "final": finite_or_none(self.final),
            "final_step": self.final_step,
            "best": finite_or_none(self.best),
            "best_step": self.best_step,
            "points": self.points,
        }


def metric_stats(job_ids: Sequence[int]) -> dict[str, dict[int, Stat]]:
    """{metric: {job id: Stat}} for every metric any of the jobs logged."""
    if not job_ids:
        return {}
    ids = [int(j) for j in job_ids]
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT job_id, name, max(last_step), sum(count),
                min(min_value) FILTER (WHERE min_value <> 'NaN'),
                max(max_value) FILTER (WHERE max_value <> 'NaN')
            FROM telemetry_metricrollup WHERE job_id = ANY(%s)
            GROUP BY job_id, name
            """,
            [ids],
        )
        rows = cur.fetchall()
    wanted = [(int(j), str(n), int(last), int(count), lo, hi) for j, n, last, count, lo, hi in rows]
    wanted = [row for row in wanted if row[1] not in NOT_COMPARED]
    if not wanted:
        return {}
    best = [(j, n, lo if not higher_is_better(n) else hi) for j, n, _, _, lo, hi in wanted]
    finals = _exact_points(
        [(j, n, last, last, None) for j, n, last, _, _, _ in wanted], order="round_number DESC, rank"
    )
    best_steps = _best_steps(best)
    stats: dict[str, dict[int, Stat]] = {}
    for (job, name, last, count, _, _), (_, _, best_value) in zip(wanted, best, strict=True):
        final = finals.get((job, name))
        stats.setdefault(name, {})[job] = Stat(
            final=final[1] if final else None,
            final_step=last,
            best=best_value,
            best_step=best_steps.get((job, name)),
            points=count,
        )
    return dict(sorted(stats.items()))


def _best_steps(best: list[tuple[int, str, float | None]]) -> dict[tuple[int, str], int]:
    """The first step where each series reaches its best value: the first tile holding it, then
    the raw points of that tile."""
    known = [(j, n, v) for j, n, v in best if v is not None]
    if not known:
        return {}
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT q.job_id, q.name, (
                SELECT r.bucket_step FROM telemetry_metricrollup r
                WHERE r.job_id = q.job_id AND r.name = q.name AND (r.min_value = q.v OR r.max_value = q.v)
                ORDER BY r.bucket_step LIMIT 1)
            FROM unnest(%s::bigint[], %s::text[], %s::float8[]) AS q(job_id, name, v)
            """,
            [[j for j, _, _ in known], [n for _, n, _ in known], [v for _, _, v in known]],
        )
        tiles = {(int(j), str(n)): t for j, n, t in cur.fetchall() if t is not None}
    from console.telemetry.models import ROLLUP_STEPS

    found = _exact_points(
        [(j, n, tiles[(j, n)], tiles[(j, n)] + ROLLUP_STEPS - 1, v) for j, n, v in known if (j, n) in tiles],
        order="step",
    )
    return {key: step for key, (step, _) in found.items()}


def _exact_points(
    queries: list[tuple[int, str, int, int, float | None]], order: str
) -> dict[tuple[int, str], tuple[int, float]]:
    """For each (job, name, lo, hi, value): the first raw point in steps [lo, hi] (with that value,
    if given), in ``order``."""
    if not queries:
        return {}
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT q.job_id, q.name, p.step, p.value
            FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::bigint[], %s::float8[])
                AS q(job_id, name, lo, hi, v)
            CROSS JOIN LATERAL (
                SELECT m.step, m.value FROM telemetry_metric m
                WHERE m.job_id = q.job_id AND m.name = q.name AND m.step BETWEEN q.lo AND q.hi
                    AND (q.v IS NULL OR m.value = q.v)
                ORDER BY {order} LIMIT 1
            ) p
            """,
            [
                [q[0] for q in queries],
                [q[1] for q in queries],
                [q[2] for q in queries],
                [q[3] for q in queries],
                [q[4] for q in queries],
            ],
        )
        return {(int(j), str(n)): (int(s), float(v)) for j, n, s, v in cur.fetchall()}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def compared_values(job: Job) -> dict[str, Any]:
    """What the hyperparameter table compares for one job: its hyperparameters, and a few spec
    fields as ``spec.<field>``."""
    values: dict[str, Any] = {str(k): v for k, v in (job.hyperparameters or {}).items()}
    for field in SPEC_FIELDS:
        value = getattr(job, field)
        if value not in ("", [], None):
            values[f"spec.{field}"] = value
    return values


def differing(jobs: Sequence[Job]) -> tuple[dict[str, dict[int, Any]], int]:
    """The keys whose values are not the same in every job ({key: {job id: value or None}}),
    and how many keys are the same everywhere."""
    per_job = {job.pk: compared_values(job) for job in jobs}
    keys = sorted({key for values in per_job.values() for key in values})
    differ: dict[str, dict[int, Any]] = {}
    same = 0
    for key in keys:
        seen = {
            _canonical(values.get(key, None)) if key in values else "\0missing" for values in per_job.values()
        }
        if len(seen) > 1:
            differ[key] = {job_id: values.get(key) for job_id, values in per_job.items()}
        else:
            same += 1
    return differ, same


def job_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "owner": job.owner.get_username() if job.owner is not None else None,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "progress": job.progress,
        "trial": _trial_of(job),
    }


def _trial_of(job: Job) -> dict[str, Any] | None:
    trial = getattr(job, "trial", None)
    if trial is None:
        return None
    return {"sweep": trial.sweep_id, "number": trial.number, "state": trial.state}


def comparison(jobs: Sequence[Job]) -> dict[str, Any]:
    """The comparison's table: the jobs, the hyperparameters that differ, each metric's final
    and best value per job (best: the highest for accuracy-like names, else the lowest)."""
    differ, same = differing(jobs)
    stats = metric_stats([job.pk for job in jobs])
    return {
        "jobs": [job_json(job) for job in jobs],
        "hyperparameters": {key: {str(j): v for j, v in values.items()} for key, values in differ.items()},
        "same_hyperparameters": same,
        "metrics": {
            name: {
                "higher_is_better": higher_is_better(name),
                "jobs": {str(job_id): stat.as_json() for job_id, stat in by_job.items()},
            }
            for name, by_job in stats.items()
        },
    }


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
