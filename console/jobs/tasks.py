"""Controller tasks (queue "control"): check the node token, then call one function in control.

Agents send these by name (workers/protocol.py); every one is idempotent and fenced by round,
so a redelivery (acks_late after a controller crash) changes nothing twice.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from workers import protocol

log = logging.getLogger(__name__)


def _authorised(token: str | None, node: str) -> bool:
    from console.jobs.control import token_ok

    if token_ok(token):
        return True
    log.warning("dropping a report from %r with a bad node token", node)
    return False


@shared_task(name="trainyard.control.reconcile", ignore_result=True)
def reconcile() -> None:
    from console.jobs import control

    control.reconcile()


@shared_task(name="trainyard.control.tick", ignore_result=True, expires=5)
def tick() -> None:
    from console.jobs import control

    control.tick()


@shared_task(name=protocol.CONTROL_REGISTER, ignore_result=True)
def register(*, token: str, node: str, session: str, info: protocol.NodeInfo, **_: Any) -> None:
    from console.jobs import control

    if _authorised(token, node):
        control.register_node(node, session, info)


@shared_task(name=protocol.CONTROL_HEARTBEAT, ignore_result=True, expires=10)
def heartbeat(
    *,
    token: str,
    node: str,
    session: str,
    load: protocol.NodeLoad,
    rounds: list[protocol.RoundStatus],
    **_: Any,
) -> None:
    from console.jobs import control

    if _authorised(token, node):
        control.heartbeat(node, session, load, rounds)


@shared_task(name=protocol.CONTROL_RANK_EXITED, ignore_result=True)
def rank_exited(*, token: str, node: str, job_id: int, round: int, exit: protocol.RankExit, **_: Any) -> None:
    from console.jobs import control

    if _authorised(token, node):
        control.rank_exited(node, int(job_id), int(round), exit)


@shared_task(name=protocol.CONTROL_ROUND_ENDED, ignore_result=True)
def round_ended(
    *,
    token: str,
    node: str,
    job_id: int,
    round: int,
    outcome: str,
    failures: list[protocol.RankExit] | None = None,
    **_: Any,
) -> None:
    from console.jobs import control

    if _authorised(token, node):
        control.round_ended(node, int(job_id), int(round), outcome, failures or [])


@shared_task(name=protocol.CONTROL_OFFLINE, ignore_result=True)
def node_offline(*, token: str, node: str, session: str, **_: Any) -> None:
    from console.jobs import control

    if _authorised(token, node):
        control.node_offline(node, session)
