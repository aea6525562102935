"""Events and live broadcasts: the one place the rest of the console reports what happened.

``emit`` stores an Event and, once the surrounding transaction commits, sends it to the
websocket groups that may show it. Group names and message types (handlers are named after the
type with the dot replaced, per the Channels docs):

- ``job.<id>``: ``job.event`` {"event": {...}}, ``job.state`` {"job": {...}}, and the log
  frames the ingest sends (``job.frame``). Metric frames do not use the channel layer: ingest
  publishes each once on Redis pub/sub and console/telemetry/fanout.py hands it to the local
  viewers of each web process.
- ``cluster``: ``cluster.node`` {"node": {...}}, ``cluster.job`` {"job": {...}}, ``cluster.event``.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from console.cluster.models import Node
from console.jobs.models import Job, job_summary
from console.telemetry.models import Event, Severity

log = logging.getLogger(__name__)

CLUSTER_GROUP = "cluster"


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def event_payload(event: Event) -> dict[str, Any]:
    return {
        "seq": event.pk,
        "job": event.job_id,
        "node": event.node.name if event.node_id and event.node else None,
        "round": event.round_number,
        "kind": event.kind,
        "severity": event.severity,
        "message": event.message,
        "data": event.data,
        "at": event.created_at.isoformat(),
    }


def node_payload(node: Node) -> dict[str, Any]:
    return {
        "id": node.pk,
        "name": node.name,
        "state": node.state,
        "cpu_percent": node.cpu_percent,
        "memory_percent": node.memory_percent,
        "last_heartbeat": node.last_heartbeat.isoformat() if node.last_heartbeat else None,
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "utilization": g.utilization,
                "memory_used_bytes": g.memory_used_bytes,
            }
            for g in node.gpus.all()
        ],
    }


def broadcast(group: str, message: dict[str, Any]) -> None:
    """Send after commit; a channel layer hiccup never fails the action that caused it."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:  # the database row is the record; live delivery is best effort
            log.warning("broadcast to %s failed", group, exc_info=True)

    transaction.on_commit(send)


def emit(
    kind: str,
    message: str,
    *,
    job: Job | None = None,
    node: Node | None = None,
    round_number: int | None = None,
    severity: str = Severity.INFO,
    **data: Any,
) -> Event:
    event = Event.objects.create(
        job=job,
        node=node,
        round_number=round_number if round_number is not None else (job.round_number if job else None),
        kind=kind,
        severity=severity,
        message=message,
        data=data,
    )
    publish(event)
    return event


def publish(event: Event) -> None:
    """Send a stored event to its job's viewers and the cluster view, after commit."""
    payload = event_payload(event)
    if event.job_id is not None:
        broadcast(job_group(event.job_id), {"type": "job.event", "event": payload})
    broadcast(CLUSTER_GROUP, {"type": "cluster.event", "event": payload})


def emit_once(
    dedupe_key: str,
    kind: str,
    message: str,
    *,
    job: Job | None = None,
    round_number: int | None = None,
    severity: str = Severity.INFO,
    **data: Any,
) -> Event | None:
    """Like ``emit``, but stores nothing (and returns None) when ``dedupe_key`` was used before.

    Telemetry replayed after an ingest crash carries the same key, so its events appear once.
    """
    event, created = Event.objects.get_or_create(
        dedupe_key=dedupe_key,
        defaults={
            "job": job,
            "round_number": round_number if round_number is not None else (job.round_number if job else None),
            "kind": kind,
            "severity": severity,
            "message": message,
            "data": data,
        },
    )
    if not created:
        return None
    publish(event)
    return event


def job_changed(job: Job) -> None:
    """Tell the job's viewers and the cluster view about a job's new state."""
    summary = job_summary(job)
    broadcast(job_group(job.pk), {"type": "job.state", "job": summary})
    broadcast(CLUSTER_GROUP, {"type": "cluster.job", "job": summary})


def node_changed(node: Node) -> None:
    broadcast(CLUSTER_GROUP, {"type": "cluster.node", "node": node_payload(node)})
