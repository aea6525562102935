"""Controller tasks for jobs (queue "control"): the periodic tick and agents' reports on rounds.

Thin: check the node's credential (console/cluster/tokens.py), then call one function. Agents send the reports by name
(workers/protocol.py). Every task retries on transient errors (console/core/retry.py) and is
safe to run twice, so a redelivery (acks_late after a controller crash) changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from console.cluster.tokens import agent_authorised
from console.core.retry import ControllerTask
from console.core.transport import CONTROL_TICK
from console.jobs import hangs, reports, scheduler
from workers import protocol


@shared_task(name=CONTROL_TICK, base=ControllerTask, ignore_result=True, expires=5)
def tick() -> None:
    scheduler.tick()


@shared_task(name=protocol.CONTROL_RANK_EXITED, base=ControllerTask, ignore_result=True)
def rank_exited(*, token: str, node: str, job_id: int, round: int, exit: protocol.RankExit, **_: Any) -> None:
    if agent_authorised(token, node):
        reports.rank_exited(node, int(job_id), int(round), exit)


@shared_task(name=protocol.CONTROL_ROUND_ENDED, base=ControllerTask, ignore_result=True)
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
    if agent_authorised(token, node):
        reports.round_ended(node, int(job_id), int(round), outcome, failures or [])


@shared_task(name=protocol.CONTROL_HANG_REPORTED, base=ControllerTask, ignore_result=True)
def hang_reported(
    *, token: str, node: str, job_id: int, round: int, report: protocol.HangReport, **_: Any
) -> None:
    if agent_authorised(token, node):
        hangs.record_report(node, int(job_id), int(round), report)
