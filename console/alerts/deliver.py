"""Sending the outbox: due deliveries are claimed, sent, and their attempt recorded.

A claim (``claimed_until``) is committed before the request, so two senders never try the same
delivery; the result is committed right after it. A failed attempt (an error, a timeout, a non-2xx
answer, a refused target) is retried with exponential back-off and jitter
(``ALERTS_RETRY_BASE_SECONDS`` * 2^n, at most ``MAX_BACKOFF``) until ``ALERTS_MAX_ATTEMPTS``, then the
delivery is FAILED. Every attempt is an ``Attempt`` row.

Webhooks are signed with the Standard Webhooks scheme (the ``standardwebhooks`` library:
``webhook-id``, ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body">`` with the channel's secret); the id is the delivery's, the same on every
attempt, so a receiver can drop a repeat. Slack channels get ``{"text": ...}`` (an incoming
webhook's format), signed the same way. E-mail goes through Django's mail backend.
"""

from __future__ import annotations

import json
import random
import time
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks import Webhook

from console.alerts import targets
from console.alerts.fire import payload
from console.alerts.models import Attempt, ChannelKind, Delivery, DeliveryState

CLAIM = timedelta(seconds=30)
BATCH = 50  # deliveries claimed per pass: one pass stays well under the claim
TIMEOUT = 5.0
MAX_BACKOFF = 300.0


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``."""
    base = settings.ALERTS_RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1)
    return min(MAX_BACKOFF, base) * (1 + 0.2 * random.random())


def claim(limit: int = BATCH) -> list[Delivery]:
    now = timezone.now()
    with transaction.atomic():
        due = list(
            Delivery.objects.select_for_update(skip_locked=True)
            .filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            .order_by("next_attempt_at", "id")[:limit]
        )
        Delivery.objects.filter(pk__in=[d.pk for d in due]).update(claimed_until=now + CLAIM)
    return due


def slack_body(body: dict[str, Any]) -> dict[str, Any]:
    link = f" <{body['job']['url']}|open>" if body.get("job") else ""
    return {"text": f"[{body['severity']}] {body['title']}{link}"}


def signed_request(secret: str, message_id: str, body: str) -> dict[str, str]:
    now = timezone.now()
    return {
        "content-type": "application/json",
        "user-agent": "Trainyard-Alerts/1",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, now, body),
    }


def send(delivery: Delivery) -> tuple[bool, int | None, str]:
    """One attempt: (ok, HTTP status, error)."""
    channel = delivery.channel
    body = payload(delivery.alert)
    if channel.kind == ChannelKind.EMAIL:
        text = json.dumps(body, indent=2, default=str)
        send_mail(f"[Trainyard] {body['title']}"[:200], text, settings.DEFAULT_FROM_EMAIL, [channel.email])
        return True, None, ""
    if channel.kind == ChannelKind.SLACK:
        body = slack_body(body)
    text = json.dumps(body, separators=(",", ":"), sort_keys=True, default=str)
    try:
        target = targets.resolve(channel.url)
    except targets.TargetRefused as error:
        return False, None, str(error)
    headers = signed_request(channel.secret, f"trainyard-delivery-{delivery.pk}", text)
    headers["host"] = target.host_header
    with httpx.Client(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as client:
        response = client.post(
            target.url, content=text.encode(), headers=headers, extensions={"sni_hostname": target.host}
        )
    if 200 <= response.status_code < 300:
        return True, response.status_code, ""
    return False, response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"


def attempt(delivery: Delivery) -> bool:
    started = time.perf_counter()
    try:
        ok, status, error = send(delivery)
    except (httpx.HTTPError, OSError) as exc:
        ok, status, error = False, None, f"{type(exc).__name__}: {exc}"[:500]
    elapsed = (time.perf_counter() - started) * 1000
    now = timezone.now()
    with transaction.atomic():
        Attempt.objects.create(
            delivery=delivery, ok=ok, status_code=status, error=error[:500], duration_ms=elapsed
        )
        delivery.attempts += 1
        delivery.claimed_until = None
        if ok:
            delivery.state = DeliveryState.SENT
            delivery.sent_at = now
        elif delivery.attempts >= settings.ALERTS_MAX_ATTEMPTS:
            delivery.state = DeliveryState.FAILED
        else:
            delivery.next_attempt_at = now + timedelta(seconds=backoff(delivery.attempts))
        delivery.save(update_fields=["attempts", "claimed_until", "state", "sent_at", "next_attempt_at"])
    return ok


def deliver_due() -> int:
    """Sends what is due; returns how many were sent."""
    sent = 0
    while True:
        batch = claim()
        for delivery in batch:
            sent += attempt(
                Delivery.objects.select_related("alert", "alert__rule", "alert__job", "channel").get(
                    pk=delivery.pk
                )
            )
        if len(batch) < BATCH:
            return sent
