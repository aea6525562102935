"""Controller tasks for jobs (queue "control"): the periodic tick and agents' reports on rounds.

Thin: check the report's seal (console/cluster/tokens.py), then call one function. Agents send the reports by name
(workers/protocol.py). Every task retries on transient errors (console/core/retry.py) and is
safe to run twice, so a redelivery (acks_late after a controller crash) changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from console.cluster.tokens import agent_authorised
from console.core.retry import ControllerTask
from console.core.transport import CONTROL_TICK
from console.jobs import reports, scheduler
from workers import protocol


@shared_task(name=CONTROL_TICK, base=ControllerTask, ignore_result=True, expires=5)
def tick() -> None:
    scheduler.tick()


@shared_task(name=protocol.CONTROL_RANK_EXITED, base=ControllerTask, ignore_result=True)
def rank_exited(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_RANK_EXITED, message):
        reports.rank_exited(message["node"], int(message["job_id"]), int(message["round"]), message["exit"])


@shared_task(name=protocol.CONTROL_ROUND_ENDED, base=ControllerTask, ignore_result=True)
def round_ended(**message: Any) -> None:
    if agent_authorised(protocol.CONTROL_ROUND_ENDED, message):
        reports.round_ended(
            message["node"],
            int(message["job_id"]),
            int(message["round"]),
            message["outcome"],
            message.get("failures") or [],
        )
