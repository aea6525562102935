"""The controller's periodic pass over sweeps (queue "control", on the beat like the tick)."""

from __future__ import annotations

from celery import shared_task

from console.core.retry import ControllerTask
from console.experiments import sweeps

SWEEPS_TICK = "trainyard.control.sweeps"


@shared_task(name=SWEEPS_TICK, base=ControllerTask, ignore_result=True, expires=5)
def advance() -> None:
    sweeps.advance_sweeps()
