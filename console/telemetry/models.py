from __future__ import annotations

from django.db import models

from console.cluster.models import Node
from console.core.events import Severity
from console.jobs.models import Job


class Event(models.Model):
    """Something that happened to a job or node: state changes, failures, anomalies.

    The primary key doubles as the websocket sequence number (monotonic per database).
    """

    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    round_number = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=64, db_index=True)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Set for events derived from telemetry (agent records, anomalies) so that ingest replaying a
    # batch after a crash cannot store the same event twice.
    dedupe_key = models.CharField(max_length=200, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"], name="event_job_seq")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class Metric(models.Model):
    """One scalar a rank logged. (job, round, rank, seq, name) identifies it: ingest is idempotent."""

    # No database-level foreign key: checking it (deferred, at commit) took a fifth of ingest's
    # time. Ingest checks the job exists for every batch, and deleting a job still deletes its
    # points (Django cascades).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics", db_constraint=False)
    round_number = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField()
    step = models.PositiveBigIntegerField()
    name = models.CharField(max_length=128)
    value = models.FloatField()
    time = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_number", "rank", "seq", "name"], name="metric_identity"
            )
        ]
        indexes = [models.Index(fields=["job", "name", "step"], name="metric_series")]


class LogLine(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    round_number = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    stream = models.CharField(max_length=6, default="stdout")
    seq = models.PositiveBigIntegerField()
    text = models.TextField()
    time = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_number", "rank", "stream", "seq"], name="logline_identity"
            )
        ]
        indexes = [models.Index(fields=["job", "rank", "id"], name="logline_by_rank")]


# Steps per MetricRollup tile. A constant, not a setting: tiles of different sizes could not be
# merged into aligned query buckets.
ROLLUP_STEPS = 100


class MetricRollup(models.Model):
    """A 100-step tile of one rank's series: min, max, total and count of its points.

    Ingest maintains tiles for every point it stores (in the same statement), so a chart over a
    long run reads tiles instead of millions of raw points, and retention can delete raw points
    past TRAINYARD_METRIC_RETENTION_DAYS while the curves and their extremes stay. ``total``
    rather than a mean so that adding points to a tile stays exact.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_rollups")
    round_number = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    name = models.CharField(max_length=128)
    bucket_step = models.PositiveBigIntegerField(help_text="First step of the bucket")
    last_step = models.PositiveBigIntegerField()
    min_value = models.FloatField()
    max_value = models.FloatField()
    total = models.FloatField()
    count = models.PositiveBigIntegerField()
    first_time = models.DateTimeField()
    last_time = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "round_number", "rank", "name", "bucket_step"], name="metric_rollup_identity"
            )
        ]
        indexes = [models.Index(fields=["job", "name", "bucket_step"], name="metric_rollup_series")]

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")
