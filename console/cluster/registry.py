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
from django.db import transaction
from django.utils import timezone
from limits import RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter

from console.cluster import hooks, network
from console.cluster.models import Gpu, Node
from console.cluster.watch import node_gone
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import NodeState
from console.core.transport import request_tick, send_on_commit
from workers import protocol

log = logging.getLogger(__name__)


def register_node(node_name: str, session: str, info: protocol.NodeInfo) -> Node | None:
    """Register (or re-register) the agent of ``node_name``; None when its protocol is refused."""
    spoken = int(info.get("protocol", 1))
    if spoken < protocol.MIN_PROTOCOL_VERSION:
        refuse(node_name, spoken, str(info.get("agent_version", "")))
        return None
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
            network.check_enrolled(node)
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
    node.agent_protocol = int(info.get("protocol", 1))
    node.agent_session = session
    node.last_heartbeat = timezone.now()


def refuse(node_name: str, spoken: int, version: str) -> None:
    """An agent speaking an older protocol than this console needs: it is told why and stops
    (workers/agent/app.py); the node stays as it was (a known node's jobs go on without it when
    its heartbeats stop)."""
    if not _register_again_limiter().hit(register_again_window(), "refused", node_name):
        return
    reason = (
        f"agent {version or '(unknown version)'} on {node_name} speaks protocol {spoken}; this console "
        f"needs protocol {protocol.MIN_PROTOCOL_VERSION} or newer: upgrade the agent (docs/deploy.md, "
        "Upgrading agents)"
    )
    log.warning("refused a registration: %s", reason)
    with transaction.atomic():
        node = Node.objects.filter(name=node_name).first()
        events.emit("node.refused", f"Refused: {reason}", node=node, severity=Severity.ERROR)
        send_on_commit(protocol.AGENT_REFUSED, protocol.node_queue(node_name), reason=reason)


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
        stale = [r for r in rounds if not protocol.RoundState(r["state"]).is_final]
        if stale:
            _fence(node, stale)
        else:
            _back_from_lost(node)
    events.node_changed(node)
    hooks.rounds_reported.send(hooks.RoundsReported(node, rounds))


def _record_load(node: Node, load: protocol.NodeLoad) -> None:
    node.last_heartbeat = timezone.now()
    node.cpu_percent = float(load.get("cpu_percent", 0.0))
    node.memory_percent = float(load.get("memory_percent", 0.0))
    # Any heartbeat answers a ping (watch.suspect): the node is alive.
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=node.last_heartbeat,
        cpu_percent=node.cpu_percent,
        memory_percent=node.memory_percent,
        pinged_at=None,
    )
    for gpu in load.get("gpus", []):
        Gpu.objects.filter(node=node, index=int(gpu["index"])).update(
            utilization=float(gpu.get("utilization", 0.0)),
            memory_used_bytes=int(gpu.get("memory_used_bytes", 0)),
        )


def _fence(node: Node, stale: list[protocol.RoundStatus]) -> None:
    """A LOST node is back (a cut link restored) with ranks of rounds that went on without it:
    it stays LOST, takes no work, until its agent has stopped them (AGENT_SYNC lists what it
    should run: nothing) and a heartbeat shows none live."""
    rounds = ", ".join(f"job {r['job_id']} round {r['round']}" for r in stale)
    log.info("node %s is back with stale ranks (%s): stopping them before it takes work", node.name, rounds)
    with decision():
        events.emit(
            "node.fencing",
            f"Node {node.name} is back; stopping its stale ranks ({rounds}) before it takes work",
            node=node,
            severity=Severity.WARNING,
        )
        sync_node(node)


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
