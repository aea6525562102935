"""Nodes leaving: missed heartbeats (LOST), clean stops and agent restarts, and drains finishing.

When a node goes, the jobs with a live round on it move on without it: cluster says so
(``hooks.node_gone``) and console/jobs/node_changes.py gives each a node-loss round (not charged),
or puts it back in the queue if too few nodes remain. The tick's drain pass (also there) moves
elastic jobs off DRAINING nodes and marks a node DRAINED here once nothing runs on it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from console.cluster import hooks
from console.cluster.models import Node
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import NodeState


def node_gone(node: Node, how: str, last_seen: datetime | None) -> None:
    """``node`` stopped running what it ran (``how``: "was lost", "went offline", "restarted";
    ``last_seen``: its last heartbeat before): the jobs on it move on without it
    (console/jobs/node_changes.py reacts). Caller holds decision()."""
    hooks.node_gone.send(hooks.NodeGone(node, how, last_seen))


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


def mark_drained(node: Node) -> None:
    """Nothing runs on the DRAINING ``node`` any more (the tick's drain pass moved it all off,
    console/jobs/node_changes.py): it is DRAINED. Caller holds decision() and the node's row."""
    node.set_state(NodeState.DRAINED)
    node.save(update_fields=["state"])
    events.emit("node.drained", f"Node {node.name} is drained", node=node)
    events.node_changed(node)
