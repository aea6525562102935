"""Alerts in-process against the real PostgreSQL and a real local HTTP receiver: rules match
events and metric tiles once each, webhooks arrive signed (Standard Webhooks) and Slack-shaped,
e-mail goes through Django's mail backend, failures are retried with back-off and every attempt
is recorded, duplicates and floods are suppressed, and webhook targets are SSRF-safe."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.utils import timezone

from console.alerts import deliver, fire, targets
from console.alerts.api import new_secret
from console.alerts.models import Alert, AlertState, Channel, Delivery, DeliveryState, Rule
from console.jobs.models import Job
from console.telemetry.models import Event, MetricRollup
from tests.support.receiver import Receiver, webhook_receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings: object) -> Iterator[Receiver]:
    settings.ALERTS_ALLOW_PRIVATE_TARGETS = True  # type: ignore[attr-defined]
    settings.ALERTS_RETRY_BASE_SECONDS = 0.0  # type: ignore[attr-defined]
    with webhook_receiver() as found:
        yield found


def subscribe(
    user: User, url: str, kinds: list[str], *, kind: str = "webhook", **rule: object
) -> tuple[Channel, Rule]:
    channel = Channel.objects.create(owner=user, name="hook", kind=kind, url=url, secret=new_secret())
    made = Rule.objects.create(owner=user, name="r", kind="event", event_kinds=kinds, **rule)
    made.channels.add(channel)
    return channel, made


def event(job: Job, kind: str = "job.failed", message: str = "rank 0 failed") -> Event:
    return Event.objects.create(job=job, kind=kind, message=message, severity="error", round_number=1)


def test_an_event_is_sent_once_signed_however_often_it_is_scanned(receiver: Receiver, operator: User) -> None:
    channel, _ = subscribe(operator, receiver.url, ["job.failed", "job.hang"])
    job = Job.objects.create(name="j", workload="mlp", owner=operator)
    failed, hung = event(job), event(job, "job.hang", "ranks 1 stopped")
    event(job, "job.running", "not watched")
    assert len(fire.scan()) == 2
    assert fire.scan() == []  # read again within the lookback: nothing new
    assert deliver.deliver_due() == 2
    assert deliver.deliver_due() == 0
    bodies = sorted((r.verified(channel.secret) for r in receiver.received), key=lambda b: b["id"])
    assert [b["title"] for b in bodies] == [f"job.failed: {failed.message}", f"job.hang: {hung.message}"]
    assert bodies[0]["job"]["id"] == job.pk and bodies[0]["type"] == "alert.v1"
    assert all(r.headers["webhook-id"].startswith("trainyard-delivery-") for r in receiver.received)
    # A body changed on the way fails verification.
    tampered = receiver.received[0]
    tampered.body = tampered.body.replace(b"failed", b"passed")
    with pytest.raises(Exception, match="signature"):
        tampered.verified(channel.secret)


def test_slack_and_email_channels(receiver: Receiver, operator: User, settings: object) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"  # type: ignore[attr-defined]
    operator.email = "op@example.com"
    _, rule = subscribe(operator, receiver.url, ["node.lost"], kind="slack")
    email = Channel.objects.create(owner=operator, name="mail", kind="email", email="op@example.com")
    rule.channels.add(email)
    Event.objects.create(kind="node.lost", message="Node gpu-3 missed 3 heartbeats", severity="warning")
    fire.scan()
    assert deliver.deliver_due() == 2
    assert receiver.received[0].json() == {"text": "[warning] node.lost: Node gpu-3 missed 3 heartbeats"}
    assert len(mail.outbox) == 1 and "node.lost" in mail.outbox[0].subject
    assert mail.outbox[0].to == ["op@example.com"]


def test_failures_are_retried_with_back_off_and_every_attempt_recorded(
    receiver: Receiver, operator: User
) -> None:
    receiver.statuses = [500, 503]
    subscribe(operator, receiver.url, ["job.failed"])
    event(Job.objects.create(name="j", workload="mlp", owner=operator))
    fire.scan()
    for _ in range(3):
        deliver.deliver_due()
        Delivery.objects.update(next_attempt_at=timezone.now())  # the back-off, passed
    delivery = Delivery.objects.get()
    assert delivery.state == DeliveryState.SENT and delivery.attempts == 3
    log = list(delivery.attempt_log.values_list("ok", "status_code"))
    assert log == [(False, 500), (False, 503), (True, 200)]
    assert len(receiver.received) == 3


def test_back_off_doubles_with_jitter_up_to_a_bound(settings: object) -> None:
    settings.ALERTS_RETRY_BASE_SECONDS = 2.0  # type: ignore[attr-defined]
    assert 2.0 <= deliver.backoff(1) <= 2.4
    assert 8.0 <= deliver.backoff(3) <= 9.6
    assert deliver.MAX_BACKOFF <= deliver.backoff(30) <= deliver.MAX_BACKOFF * 1.2


def test_a_delivery_gives_up_after_its_attempts(receiver: Receiver, operator: User, settings: object) -> None:
    settings.ALERTS_MAX_ATTEMPTS = 2  # type: ignore[attr-defined]
    settings.ALERTS_RETRY_BASE_SECONDS = 60.0  # type: ignore[attr-defined]
    receiver.statuses = [500, 500, 500]
    subscribe(operator, receiver.url, ["job.failed"])
    event(Job.objects.create(name="j", workload="mlp", owner=operator))
    fire.scan()
    deliver.deliver_due()
    delivery = Delivery.objects.get()
    # Not due again for about a minute: the next pass leaves it alone.
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=50)
    assert deliver.deliver_due() == 0 and len(receiver.received) == 1
    Delivery.objects.update(next_attempt_at=timezone.now())
    deliver.deliver_due()
    assert Delivery.objects.get().state == DeliveryState.FAILED


def test_duplicates_within_the_cooldown_and_floods_are_suppressed(receiver: Receiver, operator: User) -> None:
    subscribe(operator, receiver.url, ["loss_not_finite"], cooldown_seconds=600, max_per_hour=2)
    jobs = [Job.objects.create(name=f"j{i}", workload="mlp", owner=operator) for i in range(3)]
    for job in jobs:
        event(job, "loss_not_finite", "loss is NaN")
        event(job, "loss_not_finite", "loss is NaN again")
    fire.scan()
    states = list(Alert.objects.order_by("id").values_list("subject", "state"))
    # Per job: the first is sent, the second is within the cooldown; the third job is over the rate.
    assert [s for _, s in states] == ["sent", "suppressed", "sent", "suppressed", "suppressed", "suppressed"]
    deliver.deliver_due()
    assert len(receiver.received) == 2
    assert Alert.objects.filter(payload__suppressed="rate-limited").count() == 2


def test_rules_see_only_their_scope(receiver: Receiver, operator: User, viewer: User) -> None:
    subscribe(operator, receiver.url, ["job.*"])  # "mine"
    event(Job.objects.create(name="theirs", workload="mlp", owner=viewer))
    mine = event(Job.objects.create(name="mine", workload="mlp", owner=operator), "job.hang")
    assert [a.event_id for a in fire.scan()] == [mine.pk]


def test_a_metric_crossing_a_threshold_fires_once_per_round_and_nan_counts(
    receiver: Receiver, operator: User
) -> None:
    channel = Channel.objects.create(
        owner=operator, name="hook", kind="webhook", url=receiver.url, secret=new_secret()
    )
    rule = Rule.objects.create(
        owner=operator, name="loss", kind="metric", metric="loss", above=True, threshold=10
    )
    rule.channels.add(channel)
    job = Job.objects.create(name="j", workload="mlp", owner=operator)
    now = timezone.now()
    for bucket, high in ((0, 3.0), (100, float("nan")), (200, 50.0)):
        MetricRollup.objects.create(
            job=job, round_number=1, rank=0, name="loss", bucket_step=bucket, last_step=bucket + 99,
            min_value=1.0, max_value=high, total=1.0, count=1, first_time=now, last_time=now,
        )  # fmt: skip
    alerts = fire.scan()
    assert len(alerts) == 1 and alerts[0].key == f"metric:loss:{job.pk}:1"
    assert fire.scan() == []


def test_webhook_targets_are_ssrf_safe(operator: User, settings: object) -> None:
    settings.ALERTS_ALLOW_PRIVATE_TARGETS = False  # type: ignore[attr-defined]
    client = Client()
    client.force_login(operator)
    for url in (
        "http://127.0.0.1:8000/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/x",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://localhost/x",
        "file:///etc/passwd",
        "http://user:pw@example.com/x",
    ):
        response = client.post(
            "/api/v1/alerts/channels/",
            {"name": "x", "kind": "webhook", "url": url},
            content_type="application/json",
        )
        assert response.status_code == 400, (url, response.content)
        assert "url" in response.content.decode()
    assert not Channel.objects.exists()
    # A channel stored while allowed is still refused at send time once the setting is off: the
    # attempt is recorded, nothing is sent.
    with webhook_receiver() as receiver:
        subscribe(operator, receiver.url, ["job.failed"])
        event(Job.objects.create(name="j", workload="mlp", owner=operator))
        fire.scan()
        deliver.deliver_due()
        assert receiver.received == []
    attempt = Delivery.objects.get().attempt_log.get()
    assert not attempt.ok and "non-public" in attempt.error
    with pytest.raises(targets.TargetRefused):
        targets.resolve("http://127.0.0.1/")
    assert targets.resolve("http://127.0.0.1:9/x", allow_private=True).url == "http://127.0.0.1:9/x"


def test_the_api_keeps_each_users_subscriptions_apart(
    receiver: Receiver, operator: User, viewer: User
) -> None:
    client = Client()
    client.force_login(viewer)
    made = client.post(
        "/api/v1/alerts/channels/",
        {"name": "mine", "kind": "webhook", "url": receiver.url},
        content_type="application/json",
    )
    assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
    theirs = Channel.objects.create(
        owner=operator, name="theirs", kind="webhook", url=receiver.url, secret=new_secret()
    )
    bad = client.post(
        "/api/v1/alerts/rules/",
        {"name": "r", "kind": "event", "event_kinds": ["job.failed"], "channels": [theirs.pk]},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "channels" in bad.content.decode()
    empty = client.post(
        "/api/v1/alerts/rules/",
        {"name": "r", "kind": "event", "event_kinds": [], "channels": [made.json()["id"]]},
        content_type="application/json",
    )
    assert empty.status_code == 400
    ok = client.post(
        "/api/v1/alerts/rules/",
        {
            "name": "r",
            "kind": "goodput",
            "threshold": 0.8,
            "window_seconds": 600,
            "channels": [made.json()["id"]],
        },
        content_type="application/json",
    )
    assert ok.status_code == 201, ok.content
    listed = client.get("/api/v1/alerts/channels/").json()["results"]
    assert [c["name"] for c in listed] == ["mine"]
    assert client.get(f"/api/v1/alerts/channels/{theirs.pk}/").status_code == 404
    page = client.get("/alerts/")
    assert page.status_code == 200 and b"mine" in page.content and b"theirs" not in page.content
    assert Rule.objects.filter(owner=viewer).count() == 1 and AlertState.SENT == "sent"


def test_an_all_jobs_rule_hears_nothing_of_another_workspace(
    receiver: Receiver, operator: User, viewer: User
) -> None:
    """Attack: a user's "all jobs" rule must not leak events of a workspace they are no member of
    (failed on the code before it checked the rule owner's workspaces)."""
    from console.teams.models import Workspace

    subscribe(operator, receiver.url, ["job.*"], scope="all")
    closed = Workspace.objects.create(name="closed")
    event(Job.objects.create(name="hidden", workload="mlp", owner=viewer, workspace=closed))
    seen = event(Job.objects.create(name="open", workload="mlp", owner=viewer), "job.hang")
    assert [a.event_id for a in fire.scan()] == [seen.pk]
