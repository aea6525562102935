"""Operator actions on nodes: drain and undrain (the API, the nodes page and the admin call these).

Draining stops new work on a node; the controller's tick (console/cluster/watch.py) then moves
elastic jobs off it and marks it DRAINED once nothing runs there.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from console.cluster.models import Node
from console.core import events
from console.core.models import AuditEntry
from console.core.states import NodeState
from console.core.transport import request_tick


def drain_node(node_id: int, actor: Any) -> Node:
    """Stop placing work on a node and move elastic jobs off it (the controller does the moving)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.state in (NodeState.DRAINING, NodeState.DRAINED):
            return node
        node.set_state(NodeState.DRAINING)
        node.save(update_fields=["state"])
        AuditEntry.record(actor, "node.drain", node)
        events.emit("node.draining", f"Node {node.name} is draining", node=node)
        events.node_changed(node)
        request_tick()
    return node


def undrain_node(node_id: int, actor: Any) -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.state not in (NodeState.DRAINING, NodeState.DRAINED):
            return node
        node.set_state(NodeState.ONLINE)
        node.save(update_fields=["state"])
        AuditEntry.record(actor, "node.undrain", node)
        events.emit("node.online", f"Node {node.name} takes work again", node=node)
        events.node_changed(node)
        request_tick()
    return node
