"""Nodes leaving: missed heartbeats (LOST), clean stops and agent restarts, and drains finishing.

When a node goes, every job with a live round on it gets a node-loss round without it (not
charged), or goes back to the queue if too few nodes remain. The tick also moves elastic jobs
off DRAINING nodes and marks a node DRAINED once nothing runs on it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from console.cluster.models import Node
from console.core.decision import decision
from console.core.states import NodeState, RoundReason
from console.jobs.failures import refund_failures_caused_by
from console.jobs.membership import change_membership
from console.jobs.models import Job
from console.jobs.snapshot import live_allocations
from console.telemetry import events
from console.telemetry.models import Severity


def node_gone(node: Node, how: str, last_seen: datetime | None) -> None:
    """Every active job with a live allocation on ``node`` gets a round without it (or waits).

    ``how`` says what happened ("was lost", "went offline", "restarted"); ``last_seen`` is the
    node's last heartbeat before it went, from when rank failures on its peers are its doing.
    Caller holds decision().
    """
    for alloc in live_allocations().filter(node=node).select_related("round"):
        job = Job.lock(alloc.round.job_id)
        if job.round_number != alloc.round.number or not job.job_state.is_active:
            continue
        refund_failures_caused_by(job, node, last_seen)
        change_membership(job, RoundReason.NODE_LOSS, leaving=node, how=how)


def detect_lost_nodes() -> None:
    """Nodes whose heartbeats stopped become LOST, and their jobs move on without them."""
    limit = timezone.now() - timedelta(seconds=settings.HEARTBEAT_INTERVAL * settings.HEARTBEAT_MISSES)
    overdue = Node.objects.filter(
        Q(last_heartbeat__lt=limit) | Q(last_heartbeat__isnull=True),
        state__in=[NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED],
    ).values_list("pk", flat=True)
    for pk in list(overdue):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            if node.node_state is NodeState.LOST or not node.heartbeat_overdue():
                continue
            node.set_state(NodeState.LOST)
            node.save(update_fields=["state"])
            events.emit(
                "node.lost",
                f"Node {node.name} missed {settings.HEARTBEAT_MISSES} heartbeats",
                node=node,
                severity=Severity.WARNING,
            )
            events.node_changed(node)
            node_gone(node, "was lost", node.last_heartbeat)


def progress_drains() -> None:
    """Move elastic jobs off DRAINING nodes; a node with nothing left on it is DRAINED."""
    for pk in list(Node.objects.filter(state=NodeState.DRAINING).values_list("pk", flat=True)):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            if node.state != NodeState.DRAINING:
                continue
            for alloc in list(live_allocations().filter(node=node).select_related("round")):
                change_membership(Job.lock(alloc.round.job_id), RoundReason.DRAIN, leaving=node)
            if not live_allocations().filter(node=node).exists():
                node.set_state(NodeState.DRAINED)
                node.save(update_fields=["state"])
                events.emit("node.drained", f"Node {node.name} is drained", node=node)
                events.node_changed(node)
