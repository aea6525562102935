"""Controller tasks for nodes (queue "control"): agents' registration, heartbeats and shutdown.

Thin: check the node's credential (console/cluster/tokens.py), then call one function in console/cluster/registry.py. Every task
retries on transient errors (console/core/retry.py) and is safe to run twice.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from console.cluster import network, registry
from console.cluster.tokens import agent_authorised
from console.core.retry import ControllerTask
from workers import protocol


@shared_task(name=protocol.CONTROL_REGISTER, base=ControllerTask, ignore_result=True)
def register(*, token: str, node: str, session: str, info: protocol.NodeInfo, **_: Any) -> None:
    if agent_authorised(token, node):
        registry.register_node(node, session, info)


@shared_task(name=protocol.CONTROL_HEARTBEAT, base=ControllerTask, ignore_result=True, expires=10)
def heartbeat(
    *,
    token: str,
    node: str,
    session: str,
    load: protocol.NodeLoad,
    rounds: list[protocol.RoundStatus],
    **_: Any,
) -> None:
    if agent_authorised(token, node):
        registry.heartbeat(node, session, load, rounds)


@shared_task(name=protocol.CONTROL_OFFLINE, base=ControllerTask, ignore_result=True)
def node_offline(*, token: str, node: str, session: str, **_: Any) -> None:
    if agent_authorised(token, node):
        registry.node_offline(node, session)


@shared_task(name=protocol.CONTROL_PREFLIGHT, base=ControllerTask, ignore_result=True)
def preflight(*, token: str, node: str, check_id: int, result: protocol.PreflightResult, **_: Any) -> None:
    if agent_authorised(token, node):
        network.record_result(node, int(check_id), result)
