"""Alerts with a real controller (Celery worker and beat): a webhook receiver gets exactly one
signed alert per event while the controller is SIGKILLed and started again in the middle: the
alerts and deliveries are rows written with the match (an outbox in PostgreSQL), so the restarted
controller sends what was left and nothing twice."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User

from console.alerts.api import new_secret
from console.alerts.models import Channel, Delivery, DeliveryState, Rule
from console.jobs.models import Job
from console.telemetry.models import Event
from tests.support.cluster import Cluster
from tests.support.controller import wait_for
from tests.support.receiver import webhook_receiver

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
CONTROLLER_ENV = {"TRAINYARD_ALERTS_ALLOW_PRIVATE_TARGETS": "1", "TRAINYARD_ALERTS_RETRY_BASE_SECONDS": "0.5"}
EVENTS = 12


def test_one_signed_alert_per_event_across_a_controller_restart(cluster: Cluster) -> None:
    owner = User.objects.get(username="e2e-operator")
    job = Job.objects.create(name="watched", workload="mlp", owner=owner)
    with webhook_receiver() as receiver:
        channel = Channel.objects.create(
            owner=owner, name="hook", kind="webhook", url=receiver.url, secret=new_secret()
        )
        rule = Rule.objects.create(owner=owner, name="failures", kind="event", event_kinds=["job.failed"])
        rule.channels.add(channel)
        # A first event, to know the controller's beat runs before timing the others.
        events = [Event.objects.create(job=job, kind="job.failed", message="warm-up", severity="error")]
        wait_for(lambda: len(receiver.received) == 1, timeout=120, message="the controller's first alert")
        for i in range(1, EVENTS):
            if i == EVENTS // 3:
                # Once the first alerts went out, kill the controller mid-stream: the events from
                # now on are stored while no controller runs. (Killed while a request is on the
                # wire, a delivery goes again after its claim expires, with the same webhook-id:
                # a receiver drops it by that id. Here nothing is in flight.)
                wait_for(
                    lambda: Delivery.objects.filter(state=DeliveryState.SENT).count() == len(events),
                    timeout=60,
                    message="the first alerts",
                )
                cluster.controller.kill()
            if i == 2 * EVENTS // 3:
                cluster.controller.start()
            events.append(
                Event.objects.create(job=job, kind="job.failed", message=f"failure {i}", severity="error")
            )
            time.sleep(0.3)
        wait_for(
            lambda: Delivery.objects.filter(state=DeliveryState.SENT).count() == EVENTS,
            timeout=120,
            message=f"{EVENTS} deliveries sent",
        )
        time.sleep(2)  # long enough for a duplicate to arrive if one were on its way
        bodies = [r.verified(channel.secret) for r in receiver.received]
    ids = [b["event"]["seq"] for b in bodies]
    assert sorted(ids) == sorted(e.pk for e in events), "each event exactly once"
    assert len({r.headers["webhook-id"] for r in receiver.received}) == EVENTS
    # Before the kill, each arrived within a few controller ticks of its event.
    first = {e.pk: e.created_at.timestamp() for e in events[1 : EVENTS // 3]}
    latencies = [
        r.at - first[b["event"]["seq"]]
        for r, b in zip(receiver.received, bodies, strict=True)
        if b["event"]["seq"] in first
    ]
    assert latencies and max(latencies) < 5, latencies
