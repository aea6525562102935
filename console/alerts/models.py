"""Alerts: who wants to hear about what (rules and channels, per user), what fired (alerts), and
the outbox of deliveries with every attempt.

An alert and its deliveries are written in the transaction that matched the rule (a transactional
outbox in PostgreSQL), and a delivery is marked sent in the transaction after its attempt: a
controller killed at any point loses none and sends none twice, but for the one whose request was
on the wire when it died (it goes again after its claim expires; the receiver can tell by its
``webhook-id``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "webhook (signed JSON)"
    SLACK = "slack", "Slack-compatible webhook"
    EMAIL = "email", "e-mail"


class RuleKind(models.TextChoices):
    EVENT = "event", "an event of these kinds"
    METRIC = "metric", "a metric crosses a threshold"
    GOODPUT = "goodput", "goodput below a share over a window"


class Scope(models.TextChoices):
    MINE = "mine", "my jobs"
    ALL = "all", "every job and node"


class Channel(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_channels"
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    url = models.URLField(max_length=1000, blank=True)
    # Standard Webhooks secret ("whsec_" + base64); generated when the channel is made.
    secret = models.CharField(max_length=100, blank=True)
    email = models.EmailField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind="email", email__gt="") | (~Q(kind="email") & Q(url__gt="")),
                name="alert_channel_has_target",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Rule(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=RuleKind.choices)
    # event: kinds that fire it ("job.failed", "job.hang", "node.lost", "loss_not_finite", ...).
    event_kinds = models.JSONField(default=list, blank=True)
    # metric: a series name, "above" or "below", and the threshold (NaN counts as above anything).
    metric = models.CharField(max_length=128, blank=True)
    above = models.BooleanField(default=True)
    threshold = models.FloatField(null=True, blank=True)
    # goodput: fires when a running job's goodput over the last window_seconds is below threshold.
    window_seconds = models.PositiveIntegerField(default=600)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.MINE)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    channels = models.ManyToManyField(Channel, related_name="rules")
    # The same rule for the same job (or node) again within cooldown: recorded, not sent.
    cooldown_seconds = models.PositiveIntegerField(default=0)
    # At most this many sent per hour; the rest are recorded as suppressed.
    max_per_hour = models.PositiveIntegerField(default=30)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


class AlertState(models.TextChoices):
    SENT = "sent"  # queued for its channels (see its deliveries)
    SUPPRESSED = "suppressed"  # deduplicated (cooldown) or over the rule's rate


class Alert(models.Model):
    rule = models.ForeignKey(Rule, on_delete=models.CASCADE, related_name="alerts")
    # What it is about: the event it matched, or "metric:<job>:<round>", "goodput:<job>:<round>".
    key = models.CharField(max_length=200)
    event = models.ForeignKey(
        "telemetry.Event", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    subject = models.CharField(max_length=200, blank=True, help_text="The job or node it is about")
    state = models.CharField(max_length=16, choices=AlertState.choices)
    severity = models.CharField(max_length=8, default="warning")
    title = models.CharField(max_length=300)
    payload = models.JSONField(default=dict)
    happened_at = models.DateTimeField(help_text="When what it reports happened")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "key"], name="alert_once_per_rule_and_key")]

    def __str__(self) -> str:
        return self.title


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # gave up after MAX_ATTEMPTS


class Delivery(models.Model):
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    # A sender's claim: nobody else tries it before then (a sender that died mid-request is
    # replaced once it passes).
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["alert", "channel"], name="delivery_once_per_channel")]


class Attempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField(auto_now_add=True)
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.FloatField(default=0.0)

    class Meta:
        ordering = ["id"]
