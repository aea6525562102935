"""Retention: raw metric points past TRAINYARD_METRIC_RETENTION_DAYS are folded into MetricRollup
step buckets (min/max/total/count, so curves and their extremes survive); log lines past
TRAINYARD_LOG_RETENTION_DAYS are deleted. Events and checkpoints are kept."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console.telemetry.models import LogLine

log = logging.getLogger(__name__)

# Rows per transaction: keeps each statement's locks and memory small on a table that ingest is
# writing to at the same time.
ROLLUP_BATCH = 50_000
LOG_DELETE_BATCH = 20_000

# Moving and aggregating happen in one statement, so a crash can never lose points that were
# deleted but not yet rolled up. Re-rolling into an existing bucket merges exactly.
ROLLUP_SQL = """
    WITH moved AS (
        DELETE FROM telemetry_metric WHERE id IN (
            SELECT id FROM telemetry_metric WHERE time < %(cutoff)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED
        )
        RETURNING job_id, round_number, rank, name, step, value, time
    ), rolled AS (
    INSERT INTO telemetry_metricrollup AS r (
        job_id, round_number, rank, name, bucket_step, last_step,
        min_value, max_value, total, count, first_time, last_time
    )
    SELECT job_id, round_number, rank, name, (step / %(width)s) * %(width)s, max(step),
           min(value), max(value), sum(value), count(*), min(time), max(time)
    FROM moved
    GROUP BY job_id, round_number, rank, name, (step / %(width)s) * %(width)s
    ON CONFLICT ON CONSTRAINT metric_rollup_identity DO UPDATE SET
        last_step = GREATEST(r.last_step, EXCLUDED.last_step),
        min_value = LEAST(r.min_value, EXCLUDED.min_value),
        max_value = GREATEST(r.max_value, EXCLUDED.max_value),
        total = r.total + EXCLUDED.total,
        count = r.count + EXCLUDED.count,
        first_time = LEAST(r.first_time, EXCLUDED.first_time),
        last_time = GREATEST(r.last_time, EXCLUDED.last_time)
    RETURNING 1
    )
    SELECT count(*) FROM moved
"""


@dataclass(frozen=True)
class RetentionResult:
    points_rolled_up: int
    log_lines_deleted: int


def roll_up_metrics(cutoff: datetime, width: int) -> int:
    moved_total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(ROLLUP_SQL, {"cutoff": cutoff, "batch": ROLLUP_BATCH, "width": width})
            row = cur.fetchone()
        moved = int(row[0]) if row else 0
        moved_total += moved
        if moved < ROLLUP_BATCH:
            return moved_total


def delete_old_logs(cutoff: datetime) -> int:
    deleted = 0
    while True:
        ids = list(LogLine.objects.filter(time__lt=cutoff).values_list("pk", flat=True)[:LOG_DELETE_BATCH])
        if not ids:
            return deleted
        deleted += LogLine.objects.filter(pk__in=ids).delete()[0]


def apply_retention() -> RetentionResult:
    now = timezone.now()
    rolled = 0
    if settings.METRIC_RETENTION_DAYS > 0:
        cutoff = now - timedelta(days=settings.METRIC_RETENTION_DAYS)
        rolled = roll_up_metrics(cutoff, settings.METRIC_ROLLUP_STEPS)
    deleted = 0
    if settings.LOG_RETENTION_DAYS > 0:
        deleted = delete_old_logs(now - timedelta(days=settings.LOG_RETENTION_DAYS))
    if rolled or deleted:
        log.info("retention: rolled up %d metric points, deleted %d log lines", rolled, deleted)
    return RetentionResult(points_rolled_up=rolled, log_lines_deleted=deleted)
