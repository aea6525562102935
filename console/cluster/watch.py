"""Nodes leaving: missed heartbeats (LOST), clean stops and agent restarts, and drains finishing.

When a node goes, the jobs with a live round on it move on without it: cluster says so
(``hooks.node_gone``) and console/jobs/node_changes.py gives each a node-loss round (not charged),
or puts it back in the queue if too few nodes remain. The tick's drain pass (also there) moves
elastic jobs off DRAINING nodes and marks a node DRAINED here once nothing runs on it.
"""

from __future__ import annotations

from collections.abc import Iterable
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
from console.core.transport import send_on_commit
from workers import protocol


def node_gone(node: Node, how: str, last_seen: datetime | None) -> None:
    """``node`` stopped running what it ran (``how``: "was lost", "went offline", "restarted";
    ``last_seen``: its last heartbeat before): the jobs on it move on without it
    (console/jobs/node_changes.py reacts). Caller holds decision()."""
    hooks.node_gone.send(hooks.NodeGone(node, how, last_seen))


ALIVE = (NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED)


def detect_lost_nodes() -> None:
    """Nodes whose heartbeats stopped become LOST, and their jobs move on without them."""
    limit = timezone.now() - timedelta(seconds=settings.HEARTBEAT_INTERVAL * settings.HEARTBEAT_MISSES)
    overdue = Node.objects.filter(
        Q(last_heartbeat__lt=limit) | Q(last_heartbeat__isnull=True), state__in=ALIVE
    ).values_list("pk", flat=True)
    for pk in list(overdue):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            if node.node_state is NodeState.LOST or not node.heartbeat_overdue():
                continue
            declare_lost(node, f"Node {node.name} missed {settings.HEARTBEAT_MISSES} heartbeats")


def suspect(nodes: Iterable[Node]) -> None:
    """A peer's collective broke, and ``nodes`` (hosts of its round not heard from since) may be
    why: each is asked for a heartbeat at once (AGENT_HEARTBEAT_NOW, the ping) and declared LOST
    by ``detect_silent_suspects`` if none comes within PING_DEADLINE, rather than after
    HEARTBEAT_MISSES intervals. Caller holds decision()."""
    now = timezone.now()
    for node in nodes:
        send_on_commit(protocol.AGENT_HEARTBEAT_NOW, node.queue)
        if node.pinged_at is None:
            node.pinged_at = now
            Node.objects.filter(pk=node.pk, pinged_at__isnull=True).update(pinged_at=now)


def detect_silent_suspects() -> None:
    """Suspects (``suspect``) that have not answered their ping within PING_DEADLINE are LOST."""
    limit = timezone.now() - timedelta(seconds=settings.PING_DEADLINE)
    silent = Node.objects.filter(pinged_at__lt=limit, state__in=ALIVE).values_list("pk", flat=True)
    for pk in list(silent):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            pinged = node.pinged_at
            if node.node_state not in ALIVE or pinged is None or pinged >= limit:
                continue
            if node.last_heartbeat is not None and node.last_heartbeat >= pinged:
                Node.objects.filter(pk=pk).update(pinged_at=None)  # it answered
                continue
            declare_lost(
                node,
                f"Node {node.name} did not answer a ping within {settings.PING_DEADLINE:g} s "
                "after a peer's collective broke",
            )


def declare_lost(node: Node, message: str) -> None:
    """``node`` (locked, alive) is LOST: its jobs move on without it. Caller holds decision()."""
    node.set_state(NodeState.LOST)
    node.pinged_at = None
    node.save(update_fields=["state", "pinged_at"])
    events.emit("node.lost", message, node=node, severity=Severity.WARNING)
    events.node_changed(node)
    node_gone(node, "was lost", node.last_heartbeat)


def mark_drained(node: Node) -> None:
    """Nothing runs on the DRAINING ``node`` any more (the tick's drain pass moved it all off,
    console/jobs/node_changes.py): it is DRAINED. Caller holds decision() and the node's row."""
    node.set_state(NodeState.DRAINED)
    node.save(update_fields=["state"])
    events.emit("node.drained", f"Node {node.name} is drained", node=node)
    events.node_changed(node)
