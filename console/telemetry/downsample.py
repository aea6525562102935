"""Downsampling: display-sized series for live frames (in Python) and queries (in SQL).

Both keep the extremes: a bucket reports its minimum and maximum, so a loss spike or a NaN never
disappears from a chart because it fell between two drawn points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import connection

DEFAULT_QUERY_POINTS = 1000
MAX_QUERY_POINTS = 10000


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Infinity; browsers get null for them."""
    if value is None or not math.isfinite(value):
        return None
    return value


def thin_points(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """At most ``limit`` points of ``points`` (ordered by arrival): per bucket the lowest and the
    highest, in step order, and always the newest point so a live chart shows the latest value."""
    if len(points) <= limit:
        return points
    buckets = max(1, (limit - 1) // 2)
    size = math.ceil(len(points) / buckets)
    out: list[tuple[int, float]] = []
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        # NaN compares false with everything; treat it as the most extreme value so it shows.
        lo = min(chunk, key=lambda p: p[1] if not math.isnan(p[1]) else -math.inf)
        hi = max(chunk, key=lambda p: p[1] if not math.isnan(p[1]) else math.inf)
        pair = sorted({lo, hi}, key=lambda p: p[0])
        out.extend(pair)
    if out[-1] != points[-1]:
        out.append(points[-1])
    while len(out) > limit:
        del out[-2]
    return out


@dataclass(frozen=True)
class Bucket:
    step: int
    last_step: int
    min: float
    max: float
    mean: float
    count: int

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "last_step": self.last_step,
            "min": finite_or_none(self.min),
            "max": finite_or_none(self.max),
            "mean": finite_or_none(self.mean),
            "count": self.count,
        }


def series_names(job_id: int) -> list[str]:
    """Distinct metric names of a job by skipping through the (job, name, step) index, which stays
    fast with millions of points where a plain DISTINCT would read them all."""
    sql = """
        WITH RECURSIVE names(name) AS (
            (SELECT name FROM telemetry_metric WHERE job_id = %(job)s ORDER BY name LIMIT 1)
            UNION ALL
            SELECT (SELECT m.name FROM telemetry_metric m
                    WHERE m.job_id = %(job)s AND m.name > names.name ORDER BY m.name LIMIT 1)
            FROM names WHERE names.name IS NOT NULL
        )
        SELECT name FROM names WHERE name IS NOT NULL
        UNION
        SELECT DISTINCT name FROM telemetry_metricrollup WHERE job_id = %(job)s
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"job": job_id})
        return sorted(row[0] for row in cur.fetchall())


def _step_bounds(job_id: int, name: str, start: int | None, end: int | None) -> tuple[int, int] | None:
    lo = 0 if start is None else start
    hi = 2**62 if end is None else end
    sql = """
        SELECT min(s), max(s) FROM (
            (SELECT step AS s FROM telemetry_metric WHERE job_id = %(job)s AND name = %(name)s
                AND step BETWEEN %(lo)s AND %(hi)s ORDER BY step LIMIT 1)
            UNION ALL
            (SELECT step FROM telemetry_metric WHERE job_id = %(job)s AND name = %(name)s
                AND step BETWEEN %(lo)s AND %(hi)s ORDER BY step DESC LIMIT 1)
            UNION ALL
            (SELECT bucket_step FROM telemetry_metricrollup WHERE job_id = %(job)s AND name = %(name)s
                AND bucket_step BETWEEN %(lo)s AND %(hi)s ORDER BY bucket_step LIMIT 1)
            UNION ALL
            (SELECT bucket_step FROM telemetry_metricrollup WHERE job_id = %(job)s AND name = %(name)s
                AND bucket_step BETWEEN %(lo)s AND %(hi)s ORDER BY bucket_step DESC LIMIT 1)
        ) b
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"job": job_id, "name": name, "lo": lo, "hi": hi})
        row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def query_series(
    job_id: int,
    name: str,
    *,
    start: int | None = None,
    end: int | None = None,
    points: int = DEFAULT_QUERY_POINTS,
    rank: int | None = None,
) -> list[Bucket]:
    """A series as at most ``points`` buckets of equal step width (min/max/mean/count each),
    aggregated in PostgreSQL over raw points and rolled-up buckets alike."""
    bounds = _step_bounds(job_id, name, start, end)
    if bounds is None:
        return []
    lo, hi = bounds
    span = hi - lo + 1
    rank_filter = "" if rank is None else "AND rank = %(rank)s"
    sql = f"""
        SELECT min(step), max(last_step), min(lo), max(hi), sum(total), sum(n)
        FROM (
            SELECT step, step AS last_step, value AS lo, value AS hi, value AS total, 1 AS n
            FROM telemetry_metric
            WHERE job_id = %(job)s AND name = %(name)s AND step BETWEEN %(lo)s AND %(hi)s {rank_filter}
            UNION ALL
            SELECT bucket_step, last_step, min_value, max_value, total, count
            FROM telemetry_metricrollup
            WHERE job_id = %(job)s AND name = %(name)s AND bucket_step BETWEEN %(lo)s AND %(hi)s
                {rank_filter}
        ) p
        GROUP BY (step - %(lo)s) * %(points)s / %(span)s
        ORDER BY 1
    """
    params: dict[str, Any] = {
        "job": job_id,
        "name": name,
        "lo": lo,
        "hi": hi,
        "points": points,
        "span": span,
        "rank": rank,
    }
    with connection.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    return [
        Bucket(
            step=int(r[0]),
            last_step=int(r[1]),
            min=float(r[2]),
            max=float(r[3]),
            mean=float(r[4]) / int(r[5]),
            count=int(r[5]),
        )
        for r in rows
    ]
