from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="trainyard.telemetry.rollup", ignore_result=True)
def rollup() -> dict[str, Any]:
    """Periodic (beat): apply telemetry retention; see console.telemetry.retention."""
    from console.telemetry.retention import apply_retention

    result = apply_retention()
    return {"points_deleted": result.points_deleted, "log_lines_deleted": result.log_lines_deleted}
