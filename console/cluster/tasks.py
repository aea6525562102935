"""Controller tasks for nodes (queue "control"): agents' registration, heartbeats and shutdown.

Thin: check the report's seal (console/cluster/tokens.py), then call one function in console/cluster/registry.py. Every task
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
def register(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_REGISTER, message):
        registry.register_node(message["node"], message["session"], message["info"])


@shared_task(name=protocol.CONTROL_HEARTBEAT, base=ControllerTask, ignore_result=True, expires=10)
def heartbeat(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_HEARTBEAT, message):
        registry.heartbeat(message["node"], message["session"], message["load"], message["rounds"])


@shared_task(name=protocol.CONTROL_OFFLINE, base=ControllerTask, ignore_result=True)
def node_offline(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_OFFLINE, message):
        registry.node_offline(message["node"], message["session"])


@shared_task(name=protocol.CONTROL_PREFLIGHT, base=ControllerTask, ignore_result=True)
def preflight(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_PREFLIGHT, message):
        network.record_result(message["node"], int(message["check_id"]), message["result"])
