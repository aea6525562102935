"""Controller tasks (queue "control"). Thin: parse, then call one action in console.jobs.control."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="trainyard.control.reconcile")
def reconcile() -> None:
    from console.jobs import control

    control.reconcile()
