"""Reporting what happened: the one way cluster, jobs and core tell operators about it.

``emit`` records an event (a job's or a node's, with a kind, a message and data) and
``job_changed`` / ``node_changed`` tell live viewers about a new state. The telemetry app provides
them (console/telemetry/events.py stores the Event row and broadcasts it once the transaction
commits) and registers itself here when Django starts (``TelemetryConfig.ready``). This module is
the seam: the apps below telemetry (which reads jobs and nodes) report through it and never import
telemetry, so the apps import each other without a cycle (tests/test_app_imports.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from django.db import models


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Reporter(Protocol):
    """What the telemetry app provides."""

    def emit(
        self,
        kind: str,
        message: str,
        *,
        job: Any = None,
        node: Any = None,
        round_number: int | None = None,
        severity: str = Severity.INFO,
        **data: Any,
    ) -> Any: ...

    def job_changed(self, job: Any) -> None: ...

    def node_changed(self, node: Any) -> None: ...


_reporter: Reporter | None = None


def provide(reporter: Reporter) -> None:
    """Called once by the app that stores and broadcasts events (telemetry)."""
    global _reporter
    _reporter = reporter


def _the_reporter() -> Reporter:
    if _reporter is None:
        raise RuntimeError("no event reporter: the telemetry app is not installed or not ready")
    return _reporter


def emit(
    kind: str,
    message: str,
    *,
    job: models.Model | None = None,
    node: models.Model | None = None,
    round_number: int | None = None,
    severity: str = Severity.INFO,
    **data: Any,
) -> None:
    """Record that ``kind`` happened to ``job`` and/or ``node`` (in the current round of the job
    unless ``round_number`` says otherwise) and show it to whoever watches them."""
    _the_reporter().emit(
        kind, message, job=job, node=node, round_number=round_number, severity=severity, **data
    )


def job_changed(job: models.Model) -> None:
    """Tell the job's viewers and the cluster view about a job's new state."""
    _the_reporter().job_changed(job)


def node_changed(node: models.Model) -> None:
    """Tell the cluster view about a node's new state or load."""
    _the_reporter().node_changed(node)
