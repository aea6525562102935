"""Agents' reports about their node: registration (with GPUs), heartbeats, clean shutdown.

A node's identity is its agent's name; each agent start is a new session. A heartbeat the
console cannot place (an unknown node, a session other than the registered one, a node shown
OFFLINE or LOST) asks the agent to register again at once (at most once per heartbeat interval
per node), so a node never stays OFFLINE while its agent heartbeats. A registration under a new
session means the agent restarted and lost its ranks: its rounds go on without it, uncharged.
"""

from __future__ import annotations

import functools
import logging
import math

from django.conf import settings
from django.utils import timezone
from limits import RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter

from console.cluster import hooks
from console.cluster.models import Gpu, Node
from console.cluster.watch import node_gone
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import NodeState
from console.core.transport import request_tick, send_on_commit
from workers import protocol

log = logging.getLogger(__name__)


def register_node(node_name: str, session: str, info: protocol.NodeInfo) -> Node:
    with decision():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        created = node is None
        if node is None:
            node = Node(name=node_name, state=NodeState.ONLINE, registered_at=timezone.now())
        restarted = not created and node.agent_session != session
        last_seen = node.last_heartbeat
        was = node.state
        _update_inventory(node, session, info)
        if node.state in (NodeState.LOST, NodeState.OFFLINE):
            node.set_state(NodeState.ONLINE)
        node.save()
        gpus = _upsert_gpus(node, info)
        if created:
            message = f"Node {node.name} registered ({node.cpus} CPUs, {gpus} GPUs)"
            events.emit("node.registered", message, node=node)
        elif was != node.state:
            events.emit("node.online", f"Node {node.name} is back ({was} → ONLINE)", node=node)
        elif restarted:
            events.emit("node.restarted", f"Agent on {node.name} restarted", node=node)
        if info.get("dns_warning"):
            events.emit(
                "node.slow_dns",
                f"Node {node.name}: {info['dns_warning']}",
                node=node,
                severity=Severity.WARNING,
            )
        if restarted:
            # A restarted agent lost its ranks: their rounds go on without this node, and failures
            # its peers reported since it was last seen are not the jobs' fault.
            node_gone(node, "restarted", last_seen)
        events.node_changed(node)
        sync_node(node)
        request_tick()
    return node


def _update_inventory(node: Node, session: str, info: protocol.NodeInfo) -> None:
    node.hostname = info.get("hostname", "")[:255]
    node.address = info.get("address", "")[:255]
    node.interface = str(info.get("interface", ""))[:64]
    node.cpus = int(info.get("cpus", 0))
    node.memory_bytes = int(info.get("memory_bytes", 0))
    node.slots = int(info.get("slots", node.cpus))
    node.torch_version = str(info.get("torch_version", ""))[:32]
    node.agent_version = str(info.get("agent_version", ""))[:32]
    node.agent_session = session
    node.last_heartbeat = timezone.now()


def _upsert_gpus(node: Node, info: protocol.NodeInfo) -> int:
    seen = set()
    for gpu in info.get("gpus", []):
        seen.add(int(gpu["index"]))
        Gpu.objects.update_or_create(
            node=node,
            index=int(gpu["index"]),
            defaults={
                "name": gpu.get("name", "")[:128],
                "uuid": gpu.get("uuid", "")[:64],
                "memory_bytes": int(gpu.get("memory_bytes", 0)),
            },
        )
    node.gpus.exclude(index__in=seen).delete()
    return len(seen)


def sync_node(node: Node) -> None:
    """The agent should hear every round it is to run now (console/jobs/node_changes.py sends them)."""
    hooks.node_up.send(hooks.NodeUp(node))


def heartbeat(
    node_name: str, session: str, load: protocol.NodeLoad, rounds: list[protocol.RoundStatus]
) -> None:
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        ask_to_register(node_name, "the console does not know this node")
        return
    if node.agent_session != session:
        ask_to_register(node_name, "the console does not know this agent session")
        return
    if node.state in (NodeState.OFFLINE, NodeState.LOST):
        ask_to_register(node_name, f"the console shows this node {node.state}")
    _record_load(node, load)
    if node.state == NodeState.LOST:
        _back_from_lost(node)
    events.node_changed(node)
    hooks.rounds_reported.send(hooks.RoundsReported(node, rounds))


def _record_load(node: Node, load: protocol.NodeLoad) -> None:
    node.last_heartbeat = timezone.now()
    node.cpu_percent = float(load.get("cpu_percent", 0.0))
    node.memory_percent = float(load.get("memory_percent", 0.0))
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=node.last_heartbeat, cpu_percent=node.cpu_percent, memory_percent=node.memory_percent
    )
    for gpu in load.get("gpus", []):
        Gpu.objects.filter(node=node, index=int(gpu["index"])).update(
            utilization=float(gpu.get("utilization", 0.0)),
            memory_used_bytes=int(gpu.get("memory_used_bytes", 0)),
        )


def _back_from_lost(node: Node) -> None:
    """A heartbeat from the session we knew proves the host is back: ONLINE again, in sync."""
    with decision():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        if locked.state != NodeState.LOST:
            return
        locked.set_state(NodeState.ONLINE)
        locked.save(update_fields=["state"])
        node.state = locked.state
        events.emit("node.online", f"Node {node.name} is back", node=node)
        sync_node(node)
        request_tick()


@functools.cache
def _register_again_limiter() -> FixedWindowRateLimiter:
    return FixedWindowRateLimiter(storage_from_string(settings.REDIS_URL))


def register_again_window() -> RateLimitItemPerSecond:
    """One request per node per heartbeat interval (whole seconds, at least one)."""
    return RateLimitItemPerSecond(1, max(1, math.ceil(settings.HEARTBEAT_INTERVAL)))


def ask_to_register(node_name: str, reason: str) -> None:
    """Send AGENT_REGISTER_AGAIN to the node's queue, unless it was sent within the window."""
    if not _register_again_limiter().hit(register_again_window(), "register-again", node_name):
        return
    log.info("asking the agent on %s to register again: %s", node_name, reason)
    send_on_commit(protocol.AGENT_REGISTER_AGAIN, protocol.node_queue(node_name), reason=reason)


def node_offline(node_name: str, session: str) -> None:
    with decision():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None or node.agent_session != session or node.state == NodeState.OFFLINE:
            return
        last_seen = node.last_heartbeat
        node.set_state(NodeState.OFFLINE)
        node.save(update_fields=["state"])
        events.emit("node.offline", f"Agent on {node.name} stopped", node=node)
        events.node_changed(node)
        node_gone(node, "went offline", last_seen)
