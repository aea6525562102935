"""Retention: raw metric points past TRAINYARD_METRIC_RETENTION_DAYS are deleted, their 100-step
MetricRollup tiles (kept up to date by ingest for every point) stay, so long-run curves and their
extremes survive; log lines past TRAINYARD_LOG_RETENTION_DAYS are deleted. Events and checkpoints
are kept."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console.telemetry.models import LogLine

log = logging.getLogger(__name__)

# Rows per transaction: keeps each statement's locks and WAL small on a table that ingest is
# writing to at the same time.
METRIC_DELETE_BATCH = 50_000
LOG_DELETE_BATCH = 20_000

DELETE_METRICS_SQL = """
    DELETE FROM telemetry_metric WHERE id IN (
        SELECT id FROM telemetry_metric WHERE time < %(cutoff)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    )
"""


@dataclass(frozen=True)
class RetentionResult:
    points_deleted: int
    log_lines_deleted: int


def delete_old_points(cutoff: datetime) -> int:
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(DELETE_METRICS_SQL, {"cutoff": cutoff, "batch": METRIC_DELETE_BATCH})
            count = cur.rowcount
        deleted += count
        if count < METRIC_DELETE_BATCH:
            return deleted


def delete_old_logs(cutoff: datetime) -> int:
    deleted = 0
    while True:
        ids = list(LogLine.objects.filter(time__lt=cutoff).values_list("pk", flat=True)[:LOG_DELETE_BATCH])
        if not ids:
            return deleted
        deleted += LogLine.objects.filter(pk__in=ids).delete()[0]


def apply_retention() -> RetentionResult:
    now = timezone.now()
    points = 0
    if settings.METRIC_RETENTION_DAYS > 0:
        points = delete_old_points(now - timedelta(days=settings.METRIC_RETENTION_DAYS))
    lines = 0
    if settings.LOG_RETENTION_DAYS > 0:
        lines = delete_old_logs(now - timedelta(days=settings.LOG_RETENTION_DAYS))
    if points or lines:
        log.info("retention: deleted %d raw metric points (tiles kept), %d log lines", points, lines)
    return RetentionResult(points_deleted=points, log_lines_deleted=lines)
