"""Downsampling: display-sized series for live frames (in Python) and queries (in SQL).

Both keep the extremes: a bucket reports its minimum and maximum, so a loss spike or a NaN never
disappears from a chart because it fell between two drawn points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from console.telemetry.models import ROLLUP_STEPS

DEFAULT_QUERY_POINTS = 1000
MAX_QUERY_POINTS = 10000
MAX_STEP = 2**62


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Infinity; browsers get null for them."""
    if value is None or not math.isfinite(value):
        return None
    return value


def thin_points(points: Sequence[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """The one way a series of (step, value) points is thinned for drawing, used by the job page,
    the websocket's resume frame and ingest's live frames: at most ``limit`` points. Steps are cut
    into equal-width buckets, as ``query_series`` cuts them in SQL, and each bucket keeps its
    lowest and its highest point, so a spike or a NaN (counted as the most extreme value) never
    falls between two drawn points. The last point (the newest) is always kept. Returned in step
    order; a series within ``limit`` comes back whole."""
    if len(points) <= limit:
        return list(points)
    buckets = max(1, (limit - 1) // 2)
    lo = min(step for step, _ in points)
    span = max(step for step, _ in points) - lo + 1
    extremes: dict[int, tuple[tuple[int, float], tuple[int, float]]] = {}
    for point in points:
        index = (point[0] - lo) * buckets // span
        kept = extremes.get(index)
        if kept is None:
            extremes[index] = (point, point)
            continue
        low, high = kept
        if _rank(point[1], -math.inf) < _rank(low[1], -math.inf):
            low = point
        if _rank(point[1], math.inf) > _rank(high[1], math.inf):
            high = point
        extremes[index] = (low, high)
    out = sorted({p for pair in extremes.values() for p in pair}, key=lambda p: p[0])
    newest = points[-1]
    if newest not in out:
        out.append(newest)
    while len(out) > limit:
        del out[-2]
    return out


def _rank(value: float, nan_as: float) -> float:
    # NaN compares false with everything; treat it as the most extreme value so it shows.
    return nan_as if math.isnan(value) else value


@dataclass(frozen=True)
class Bucket:
    step: int
    last_step: int
    min: float
    max: float
    mean: float
    count: int
    time: float | None = None  # Unix time of the bucket's first point (the comparison's time axis)

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "last_step": self.last_step,
            "min": finite_or_none(self.min),
            "max": finite_or_none(self.max),
            "mean": finite_or_none(self.mean),
            "count": self.count,
            "time": self.time,
        }


def series_names(job_id: int) -> list[str]:
    """Distinct metric names of a job. Every stored point has a tile, so the tiles know every
    name; skipping through their (job, name, bucket_step) index stays fast on long runs where a
    plain DISTINCT would read everything."""
    sql = """
        WITH RECURSIVE names(name) AS (
            (SELECT name FROM telemetry_metricrollup WHERE job_id = %(job)s ORDER BY name LIMIT 1)
            UNION ALL
            SELECT (SELECT r.name FROM telemetry_metricrollup r
                    WHERE r.job_id = %(job)s AND r.name > names.name ORDER BY r.name LIMIT 1)
            FROM names WHERE names.name IS NOT NULL
        )
        SELECT name FROM names WHERE name IS NOT NULL
    """
    with connection.cursor() as cur:
        cur.execute(sql, {"job": job_id})
        return [row[0] for row in cur.fetchall()]


# Whose points a query reads: every rank's (None), one rank's, or some processes' as (round,
# rank) pairs (a parameter-server process is a rank of a round: console/telemetry/role_series.py).
Members = Sequence[tuple[int, int]]


def _scope(rank: int | None, members: Members | None) -> tuple[str, dict[str, Any]]:
    """The SQL condition (on telemetry_metric or telemetry_metricrollup) and its parameters."""
    parts: list[str] = []
    params: dict[str, Any] = {}
    if rank is not None:
        parts.append("AND rank = %(rank)s")
        params["rank"] = rank
    if members is not None:
        parts.append(
            "AND (round_number, rank) IN "
            "(SELECT * FROM unnest(%(member_rounds)s::integer[], %(member_ranks)s::integer[]))"
        )
        params["member_rounds"] = [int(r) for r, _ in members]
        params["member_ranks"] = [int(k) for _, k in members]
    return " ".join(parts), params


def _bounds(
    job_id: int, name: str, lo: int, hi: int, rank: int | None, members: Members | None = None
) -> tuple[int, int] | None:
    """First and last step with data in [lo, hi], from raw points and tiles (raw points may be
    gone past retention; a tile's start stands in for its first step)."""
    rank_filter, scope = _scope(rank, members)
    sql = f"""
        SELECT
            (SELECT step FROM telemetry_metric WHERE job_id = %(job)s AND name = %(name)s
                AND step BETWEEN %(lo)s AND %(hi)s {rank_filter} ORDER BY step LIMIT 1),
            (SELECT step FROM telemetry_metric WHERE job_id = %(job)s AND name = %(name)s
                AND step BETWEEN %(lo)s AND %(hi)s {rank_filter} ORDER BY step DESC LIMIT 1),
            (SELECT bucket_step FROM telemetry_metricrollup WHERE job_id = %(job)s AND name = %(name)s
                AND bucket_step BETWEEN %(tile_lo)s AND %(hi)s AND last_step >= %(lo)s {rank_filter}
                ORDER BY bucket_step LIMIT 1),
            (SELECT last_step FROM telemetry_metricrollup WHERE job_id = %(job)s AND name = %(name)s
                AND bucket_step BETWEEN %(tile_lo)s AND %(hi)s AND last_step >= %(lo)s {rank_filter}
                ORDER BY bucket_step DESC LIMIT 1)
    """
    params: dict[str, Any] = {
        "job": job_id,
        "name": name,
        "lo": lo,
        "hi": hi,
        "tile_lo": lo - lo % ROLLUP_STEPS,
        **scope,
    }
    with connection.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    if row is None:
        return None
    firsts = [int(v) for v in (row[0], row[2]) if v is not None]
    lasts = [int(v) for v in (row[1], row[3]) if v is not None]
    if not firsts:
        return None
    return max(lo, min(firsts)), min(hi, max(lasts))


def _buckets(sql: str, params: dict[str, Any]) -> list[Bucket]:
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
            time=r[6].timestamp() if r[6] is not None else None,
        )
        for r in rows
    ]


def _from_tiles(
    job_id: int, name: str, lo: int, hi: int, points: int, rank: int | None, members: Members | None = None
) -> list[Bucket]:
    """Buckets whose edges sit on tile boundaries, so that every tile falls in exactly one: whole
    tiles inside [lo, hi] come from MetricRollup, the partly covered tiles at both ends from raw
    points. Min, max and count stay exact for the range asked."""
    origin = (lo // ROLLUP_STEPS) * ROLLUP_STEPS
    width = math.ceil(math.ceil((hi - origin + 1) / points) / ROLLUP_STEPS) * ROLLUP_STEPS
    full_lo = -(-lo // ROLLUP_STEPS) * ROLLUP_STEPS
    full_end = ((hi + 1) // ROLLUP_STEPS) * ROLLUP_STEPS - 1
    rank_filter, scope = _scope(rank, members)
    sql = f"""
        SELECT min(s), max(ls), min(lo_v), max(hi_v), sum(total), sum(n), min(t)
        FROM (
            SELECT bucket_step AS s, last_step AS ls, min_value AS lo_v, max_value AS hi_v, total, count AS n,
                first_time AS t
            FROM telemetry_metricrollup
            WHERE job_id = %(job)s AND name = %(name)s
                AND bucket_step >= %(full_lo)s AND bucket_step + {ROLLUP_STEPS - 1} <= %(hi)s {rank_filter}
            UNION ALL
            SELECT step, step, value, value, value, 1, time
            FROM telemetry_metric
            WHERE job_id = %(job)s AND name = %(name)s AND step BETWEEN %(lo)s AND %(hi)s
                AND (step < %(full_lo)s OR step > %(full_end)s) {rank_filter}
        ) p
        GROUP BY (s - %(origin)s) / %(width)s
        ORDER BY 1
    """
    params = {
        "job": job_id,
        "name": name,
        "lo": lo,
        "hi": hi,
        "origin": origin,
        "width": width,
        "full_lo": full_lo,
        "full_end": full_end,
        **scope,
    }
    return _buckets(sql, params)


def query_series(
    job_id: int,
    name: str,
    *,
    start: int | None = None,
    end: int | None = None,
    points: int = DEFAULT_QUERY_POINTS,
    rank: int | None = None,
    members: Members | None = None,
) -> list[Bucket]:
    """A series as at most ``points`` buckets of equal step width (min/max/mean/count each).

    Ranges whose buckets would span a tile or more are answered from the 100-step tiles ingest
    keeps (a million points read as ten thousand tiles), with bucket edges on tile boundaries;
    narrower ones from raw points. Where retention already removed the raw points, tiles answer.
    ``rank`` or ``members`` ((round, rank) pairs) narrow it to some processes' points.
    """
    first, last = 0 if start is None else start, MAX_STEP if end is None else end
    bounds = _bounds(job_id, name, first, last, rank, members)
    if bounds is None:
        return []
    lo, hi = bounds
    span = hi - lo + 1
    if span / points >= ROLLUP_STEPS:
        return _from_tiles(job_id, name, lo, hi, points, rank, members)
    rank_filter, scope = _scope(rank, members)
    sql = f"""
        SELECT min(step), max(step), min(value), max(value), sum(value), count(*), min(time)
        FROM telemetry_metric
        WHERE job_id = %(job)s AND name = %(name)s AND step BETWEEN %(lo)s AND %(hi)s {rank_filter}
        GROUP BY (step - %(lo)s) * %(points)s / %(span)s
        ORDER BY 1
    """
    params = {"job": job_id, "name": name, "lo": lo, "hi": hi, "points": points, "span": span, **scope}
    buckets = _buckets(sql, params)
    if buckets:
        return buckets
    # Raw points of this range are gone (retention): show the tiles that cover it.
    tile_hi = hi - hi % ROLLUP_STEPS + ROLLUP_STEPS - 1
    return _from_tiles(job_id, name, lo - lo % ROLLUP_STEPS, tile_hi, points, rank, members)
