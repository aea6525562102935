"""Rules matched against what happened: new alerts and their deliveries, in one transaction.

``scan`` runs on the controller's beat. It reads the events of the last ``LOOKBACK`` (not "after
the last id seen": ids are taken when a row is inserted, so a transaction that commits late can
add an event below one already read), the metric tiles written in that time and, every
``GOODPUT_EVERY``, running jobs' goodput; each match is an ``Alert`` keyed by what it is about,
unique per rule, so reading the same event again adds nothing. In the same transaction each new
alert gets a ``Delivery`` per channel of its rule (the outbox), unless it is suppressed: the same
rule for the same job or node within the rule's cooldown (deduplicated), or past its
``max_per_hour``. Scans are serialised by an advisory lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from console.alerts.models import Alert, AlertState, Delivery, Rule, RuleKind, Scope
from console.core.states import JobState
from console.jobs.models import Job
from console.teams import access
from console.teams.models import Role
from console.telemetry import goodput, goodput_data
from console.telemetry.events import event_payload
from console.telemetry.models import Event, MetricRollup

LOOKBACK = timedelta(seconds=60)
GOODPUT_EVERY = 30.0
SCAN_LOCK = 0x7A1E27  # pg_advisory_xact_lock key: one scan at a time
_last_goodput = 0.0


@dataclass(frozen=True)
class Match:
    rule: Rule
    key: str
    title: str
    happened_at: datetime
    severity: str = "warning"
    job: Job | None = None
    event: Event | None = None
    subject: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _kind_matches(patterns: Iterable[str], kind: str) -> bool:
    return any(kind == p or (p.endswith("*") and kind.startswith(p[:-1])) for p in patterns)


def in_scope(rule: Rule, job: Job | None) -> bool:
    """A rule about one job sees that job; "mine" the owner's jobs; "all" every job its owner may
    see (their workspaces'; a site admin's: all); node news reaches every rule."""
    if job is None:
        return rule.job_id is None
    if rule.job_id is not None and job.pk != rule.job_id:
        return False
    if rule.job_id is None and rule.scope != Scope.ALL and job.owner_id != rule.owner_id:
        return False
    # Never news of a job its owner may not see (another workspace's, or one they left).
    return access.may(rule.owner, job.workspace_id, Role.VIEWER)


def event_matches(rules: list[Rule], events: Iterable[Event]) -> list[Match]:
    out = []
    for event in events:
        for rule in rules:
            if _kind_matches(rule.event_kinds, event.kind) and in_scope(rule, event.job):
                subject = (
                    f"job {event.job.name} (#{event.job_id})"
                    if event.job
                    else (f"node {event.node.name}" if event.node else "cluster")
                )
                out.append(
                    Match(
                        rule,
                        f"event:{event.pk}",
                        f"{event.kind}: {event.message}",
                        event.created_at,
                        severity=event.severity,
                        job=event.job,
                        event=event,
                        subject=subject,
                        details={"event": event_payload(event)},
                    )
                )
    return out


def metric_matches(rules: list[Rule], since: datetime) -> list[Match]:
    out = []
    for rule in rules:
        if rule.threshold is None or not rule.metric:
            continue
        crossed = Q(max_value__gt=rule.threshold) if rule.above else Q(min_value__lt=rule.threshold)
        # NaN compares above everything in PostgreSQL: "loss above X" catches a NaN loss too.
        tiles = (
            MetricRollup.objects.filter(name=rule.metric, last_time__gte=since)
            .filter(crossed)
            .select_related("job", "job__owner")
            .order_by("job_id", "round_number", "last_time")
        )
        seen = set()
        for tile in tiles:
            key = f"metric:{rule.metric}:{tile.job_id}:{tile.round_number}"
            if key in seen or not in_scope(rule, tile.job):
                continue
            seen.add(key)
            value = tile.max_value if rule.above else tile.min_value
            word = "above" if rule.above else "below"
            out.append(
                Match(
                    rule,
                    key,
                    f"{rule.metric} {word} {rule.threshold:g} in job {tile.job.name} (#{tile.job_id}): {value:g}",
                    tile.last_time,
                    job=tile.job,
                    subject=f"job {tile.job.name} (#{tile.job_id})",
                    details={
                        "metric": rule.metric,
                        # JSON has no NaN or infinity: those are null, with the text beside.
                        "value": value if math.isfinite(value) else None,
                        "value_text": f"{value:g}",
                        "round": tile.round_number,
                        "step": tile.last_step,
                    },
                )
            )
    return out


def goodput_matches(rules: list[Rule], now: float) -> list[Match]:
    out: list[Match] = []
    jobs = list(Job.objects.filter(state=JobState.RUNNING).select_related("owner"))
    if not rules or not jobs:
        return out
    computed = {pk: goodput.compute(t) for pk, t in goodput_data.timelines(jobs, now).items()}
    for rule in rules:
        for job in jobs:
            if rule.threshold is None or not in_scope(rule, job):
                continue
            result = computed[job.pk]
            if result.wall < rule.window_seconds:
                continue  # too young to judge over the whole window
            ratio = result.clipped(now - rule.window_seconds, now).ratio
            if ratio is None or ratio >= rule.threshold:
                continue
            out.append(
                Match(
                    rule,
                    f"goodput:{job.pk}:{job.round_number}",
                    f"goodput of job {job.name} (#{job.pk}) is {100 * ratio:.1f}% over the last "
                    f"{rule.window_seconds} s (below {100 * rule.threshold:.0f}%)",
                    timezone.now(),
                    job=job,
                    subject=f"job {job.name} (#{job.pk})",
                    details={"goodput": ratio, "window_seconds": rule.window_seconds},
                )
            )
    return out


def payload(alert: Alert) -> dict[str, Any]:
    """The JSON a webhook receives (the ``alert.v1`` shape, README "Alerts")."""
    job = alert.job
    base = getattr(settings, "TRAINYARD_PUBLIC_URL", "").rstrip("/")
    return {
        "type": "alert.v1",
        "id": alert.pk,
        "rule": {"id": alert.rule_id, "name": alert.rule.name, "kind": alert.rule.kind},
        "title": alert.title,
        "severity": alert.severity,
        "subject": alert.subject,
        "job": {"id": job.pk, "name": job.name, "url": f"{base}/jobs/{job.pk}/"} if job else None,
        "happened_at": alert.happened_at.isoformat(),
        "created_at": alert.created_at.isoformat(),
        **alert.payload,
    }


def _suppressed(match: Match, now: datetime) -> str:
    rule = match.rule
    recent = Alert.objects.filter(rule=rule, state=AlertState.SENT)
    if rule.cooldown_seconds and match.subject:
        since = now - timedelta(seconds=rule.cooldown_seconds)
        if recent.filter(subject=match.subject, created_at__gte=since).exists():
            return "deduplicated"
    if recent.filter(created_at__gte=now - timedelta(hours=1)).count() >= rule.max_per_hour:
        return "rate-limited"
    return ""


def record(matches: list[Match]) -> list[Alert]:
    """New alerts (and their deliveries) for the matches not recorded yet. Caller holds the lock."""
    now = timezone.now()
    known = set(
        Alert.objects.filter(
            rule_id__in={m.rule.pk for m in matches}, key__in={m.key for m in matches}
        ).values_list("rule_id", "key")
    )
    created = []
    for match in sorted(matches, key=lambda m: m.happened_at):
        if (match.rule.pk, match.key) in known:
            continue
        known.add((match.rule.pk, match.key))
        why = _suppressed(match, now)
        alert = Alert.objects.create(
            rule=match.rule,
            key=match.key,
            event=match.event,
            job=match.job,
            subject=match.subject,
            state=AlertState.SUPPRESSED if why else AlertState.SENT,
            severity=match.severity,
            title=match.title,
            payload={**match.details, **({"suppressed": why} if why else {})},
            happened_at=match.happened_at,
        )
        if not why:
            Delivery.objects.bulk_create(
                Delivery(alert=alert, channel=channel, next_attempt_at=now)
                for channel in match.rule.channels.all()
            )
        created.append(alert)
    return created


def scan(now: float | None = None) -> list[Alert]:
    global _last_goodput
    now = time.time() if now is None else now
    since = datetime.fromtimestamp(now, tz=timezone.get_current_timezone()) - LOOKBACK
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SCAN_LOCK])
        rules = list(Rule.objects.filter(enabled=True).prefetch_related("channels"))
        by_kind: dict[str, list[Rule]] = {k: [r for r in rules if r.kind == k] for k in RuleKind.values}
        matches: list[Match] = []
        event_rules = by_kind[RuleKind.EVENT]
        if event_rules:
            exact = {k for r in event_rules for k in r.event_kinds if not k.endswith("*")}
            prefixes = [k[:-1] for r in event_rules for k in r.event_kinds if k.endswith("*")]
            wanted = Q(kind__in=exact)
            for prefix in prefixes:
                wanted |= Q(kind__startswith=prefix)
            events = Event.objects.filter(created_at__gte=since).filter(wanted).select_related("job", "node")
            matches += event_matches(event_rules, events.order_by("id"))
        if by_kind[RuleKind.METRIC]:
            matches += metric_matches(by_kind[RuleKind.METRIC], since)
        if by_kind[RuleKind.GOODPUT] and now - _last_goodput >= GOODPUT_EVERY:
            _last_goodput = now
            matches += goodput_matches(by_kind[RuleKind.GOODPUT], now)
        return record(matches) if matches else []
