"""The controller's alerts pass (queue "control", on the beat like the tick): rules matched, then
the outbox sent."""

from __future__ import annotations

from celery import shared_task

from console.alerts import deliver, fire
from console.core.retry import ControllerTask

ALERTS_TICK = "trainyard.control.alerts"


@shared_task(name=ALERTS_TICK, base=ControllerTask, ignore_result=True, expires=5)
def alerts_pass() -> None:
    fire.scan()
    deliver.deliver_due()
