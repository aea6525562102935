"""Pre-flight network checks: can the nodes that would run a round together reach each other?

``request_check`` asks each node's agent (protocol.AGENT_PREFLIGHT) to listen on a port of the
range rounds listen on and probe its peers there (TCP reach, latency, bandwidth), the console URL
and DNS (workers/agent/preflight.py); ``record_result`` keeps each agent's answer and, once
every node answered or the deadline passed, the latest word per direction of each pair
(``NodeLink``). Checks run when a node enrols (against up to PREFLIGHT_PEERS others), before a
job's first round on nodes not checked together (console/jobs/scheduler.py), and when an
operator asks (API, node page, ``trainyard network check``).

A pair whose link failed in either direction keeps jobs off it: planning reads ``failed_pairs``
(console/jobs/snapshot.py) and the queue says why. A link is judged only when its target was
listening (it answered the check and could bind its port): a node that never answered is
unknown, not failed (its heartbeats say whether it is alive).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.cluster.models import NetworkCheck, Node, NodeLink
from console.core import events
from console.core.events import Severity
from console.core.states import NodeState
from console.core.transport import request_tick, send_on_commit
from workers import protocol

log = logging.getLogger(__name__)

# Listen ports of rounds (console/jobs/wiring.py draws stores, PS and coordinators from it) and of
# pre-flight checks: below Linux's ephemeral range (32768+) so outgoing connections never hold a
# port handed to a listener.
PORT_RANGE = (20000, 32000)
# After the deadline the agents' answers are late: the check is finished without them.
ANSWER_GRACE = timedelta(seconds=2)


def online_nodes(names: Iterable[str] | None = None) -> list[Node]:
    nodes = Node.objects.filter(state__in=[NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED])
    if names is not None:
        nodes = nodes.filter(name__in=list(names))
    return list(nodes.order_by("name"))


def request_check(
    nodes: Sequence[Node],
    reason: NetworkCheck.Reason,
    *,
    hub: Node | None = None,
    user: Any = None,
) -> NetworkCheck:
    """Start a check over ``nodes``: every pair, or with ``hub`` only the hub's pairs (a node that
    just enrolled and the others). The agents answer with CONTROL_PREFLIGHT (``record_result``)."""
    names = sorted({n.name for n in nodes})
    by_name = {n.name: n for n in nodes}
    rng = random.Random()
    held = recent_check_ports()
    ports: dict[str, int] = {}
    for name in names:
        avoid = held.get(by_name[name].pk, set())
        port = rng.randrange(*PORT_RANGE)
        while port in avoid:
            port = rng.randrange(*PORT_RANGE)
        ports[name] = port
    now = timezone.now()
    check = NetworkCheck.objects.create(
        reason=reason,
        requested_by=user if getattr(user, "is_authenticated", False) else None,
        created_at=now,
        deadline_at=now + timedelta(seconds=settings.PREFLIGHT_DEADLINE),
        nodes=names,
        ports=ports,
    )
    for name in names:
        if hub is None:
            peers = [p for p in names if p != name]
        else:
            peers = [p for p in names if p != name] if name == hub.name else [hub.name]
        request = protocol.PreflightRequest(
            check_id=check.pk,
            listen_port=ports[name],
            peers=[
                protocol.PreflightPeer(node=p, address=_address(by_name[p]), port=ports[p]) for p in peers
            ],
            console_url=settings.TRAINYARD_PUBLIC_URL,
            deadline=float(settings.PREFLIGHT_DEADLINE),
            bandwidth_bytes=int(settings.PREFLIGHT_BANDWIDTH_BYTES),
        )
        send_on_commit(
            protocol.AGENT_PREFLIGHT,
            by_name[name].queue,
            expires=float(settings.PREFLIGHT_DEADLINE),
            request=request,
        )
    log.info("network check %s (%s) over %s", check.pk, reason, ", ".join(names))
    return check


def _address(node: Node) -> str:
    return node.address or node.hostname or "127.0.0.1"


def check_enrolled(node: Node) -> NetworkCheck | None:
    """A node just enrolled: check it against up to PREFLIGHT_PEERS nodes (its console reach and
    DNS alone when it is the first)."""
    if not settings.PREFLIGHT:
        return None
    others = [n for n in online_nodes() if n.pk != node.pk][: settings.PREFLIGHT_PEERS]
    return request_check([node, *others], NetworkCheck.Reason.ENROLMENT, hub=node)


def check_unchecked(node_ids: Sequence[int]) -> NetworkCheck | None:
    """Before a job's first round on ``node_ids``: check them when a pair among them was never
    checked (and no check of it is running)."""
    if not settings.PREFLIGHT or len(node_ids) < 2:
        return None
    wanted = {frozenset((a, b)) for a in node_ids for b in node_ids if a != b}
    known = {
        frozenset(pair)
        for pair in NodeLink.objects.filter(source_id__in=node_ids, target_id__in=node_ids).values_list(
            "source_id", "target_id"
        )
    }
    missing = wanted - known
    if not missing:
        return None
    nodes = list(Node.objects.filter(pk__in=node_ids))
    names = {n.name for n in nodes}
    for running in NetworkCheck.objects.filter(finished_at__isnull=True):
        if names <= set(running.nodes):
            return None
    return request_check(nodes, NetworkCheck.Reason.FIRST_ROUND)


def record_result(node_name: str, check_id: int, result: protocol.PreflightResult) -> None:
    """An agent's answer to check ``check_id``: kept, and the check finished once every node of
    it answered."""
    with transaction.atomic():
        check = NetworkCheck.objects.select_for_update().filter(pk=check_id).first()
        if check is None or node_name not in check.nodes or check.done:
            return
        check.results[node_name] = dict(result)
        check.save(update_fields=["results"])
        if not check.silent:
            finish(check)


def expire_checks() -> None:
    """The tick's pass: checks past their deadline are finished with the answers they have."""
    late = NetworkCheck.objects.filter(
        finished_at__isnull=True, deadline_at__lt=timezone.now() - ANSWER_GRACE
    )
    for pk in list(late.values_list("pk", flat=True)):
        with transaction.atomic():
            check = NetworkCheck.objects.select_for_update().get(pk=pk)
            if not check.done:
                finish(check)


def finish(check: NetworkCheck) -> None:
    """Judge each link of ``check`` whose target listened, keep it per pair, and say what was
    found (caller holds the check's row)."""
    nodes = {n.name: n for n in Node.objects.filter(name__in=check.nodes)}
    now = timezone.now()
    failed: list[str] = []
    judged = 0
    for source, result in check.results.items():
        for peer in result.get("peers", []):
            target = peer.get("node", "")
            heard = check.results.get(target)
            if source not in nodes or target not in nodes or not heard or not heard.get("listening"):
                continue  # the target never listened: nothing is known about the link
            judged += 1
            ok = bool(peer.get("ok"))
            NodeLink.objects.update_or_create(
                source=nodes[source],
                target=nodes[target],
                defaults={
                    "check_run": check,
                    "ok": ok,
                    "latency_ms": peer.get("latency_ms"),
                    "bandwidth_mbps": peer.get("bandwidth_mbps"),
                    "error": str(peer.get("error", ""))[:2000],
                    "checked_at": now,
                },
            )
            if not ok:
                failed.append(f"{source} → {target}: {peer.get('error', '')}")
    problems = [
        f"{name}: console unreachable ({result.get('console_error', '')})"
        for name, result in sorted(check.results.items())
        if not result.get("console_ok")
    ] + [
        f"{name}: {result['dns_error']}"
        for name, result in sorted(check.results.items())
        if result.get("dns_error")
    ]
    check.finished_at = now
    check.save(update_fields=["finished_at"])
    took = (now - check.created_at).total_seconds()
    silent = check.silent
    summary = (
        f"Network check {check.pk} ({check.reason}) of {', '.join(check.nodes)}: {judged} link(s) tested"
    )
    summary += f", {len(failed)} failed" if failed else ", all reachable"
    if silent:
        summary += f"; no answer from {', '.join(silent)}"
    summary += f" ({took:.1f} s)"
    events.emit(
        "network.checked",
        summary,
        severity=Severity.WARNING if failed or problems or silent else Severity.INFO,
        check=check.pk,
        failed=failed,
        problems=problems,
    )
    if failed or judged:
        request_tick()  # placement may change either way


def failed_pairs() -> dict[frozenset[int], str]:
    """Node pairs (by id) whose latest check failed in either direction, with what failed."""
    pairs: dict[frozenset[int], str] = {}
    for source, target, source_name, target_name, error in NodeLink.objects.filter(ok=False).values_list(
        "source_id", "target_id", "source__name", "target__name", "error"
    ):
        pairs.setdefault(frozenset((source, target)), f"{source_name} → {target_name}: {error}")
    return pairs


def recent_check_ports() -> dict[int, set[int]]:
    """Ports pre-flight listeners held lately, by node id (rounds' listeners avoid them)."""
    since = timezone.now() - timedelta(seconds=settings.PREFLIGHT_DEADLINE) - ANSWER_GRACE
    ids = dict(Node.objects.values_list("name", "pk"))
    held: dict[int, set[int]] = {}
    for ports in NetworkCheck.objects.filter(created_at__gte=since).values_list("ports", flat=True):
        for name, port in ports.items():
            if name in ids:
                held.setdefault(ids[name], set()).add(int(port))
    return held


def links_of(node: Node) -> list[NodeLink]:
    """Every link from or to ``node``, newest word each."""
    return list(
        NodeLink.objects.filter(source=node).select_related("source", "target")
        | NodeLink.objects.filter(target=node).select_related("source", "target")
    )


def latest_check_of(node: Node) -> NetworkCheck | None:
    """The newest finished check ``node`` answered (its console reach and DNS times)."""
    for check in NetworkCheck.objects.filter(finished_at__isnull=False)[:50]:
        if node.name in check.results:
            return check
    return None
