from __future__ import annotations

from django.db import models

from console.cluster.models import Node
from console.jobs.models import Job


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


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

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
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


class MetricRollup(models.Model):
    """Raw metric points older than the retention period, folded into step buckets.

    One row per (job, round, rank, name, bucket): enough to redraw a long run's curves with their
    extremes after the raw points are gone. ``total`` rather than a mean so that rolling up more
    points into an existing bucket stays exact.
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
