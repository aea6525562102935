"""Failure policy: what a rank failure costs a job.

A round's first rank failure is recorded: the round moves to SETTLING (console/core/states.py's
RoundPhase; ``Round.failed_at``, ``Round.failure``). It is settled, charged against max_restarts,
only once every host of the round has shown it is alive
since the failure (a report or heartbeat after it, or, for a round recovered in place, a heartbeat
saying its ranks wait for the next round: they saw the failure's broken collective; the controller asks the hosts not yet heard from for a
heartbeat at once, AGENT_HEARTBEAT_NOW): peers of a dead host fail in their collectives long before its heartbeats
are missed, and a host that never answers is declared LOST (or re-registers after an agent
restart), whose node-loss round replaces this one uncharged. Past max_restarts the job FAILS
with the first failing rank as its root cause.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from console.cluster.models import Node
from console.cluster.watch import suspect
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import AllocationState, JobState, NodeState, RoundPhase, RoundReason
from console.jobs.inplace import fall_back
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job, Round
from console.jobs.rounds import finish_job
from console.jobs.snapshot import members
from workers import protocol
from workers.protocol import InplaceStatus


def failed(exit: protocol.RankExit) -> bool:
    return exit.get("exit_code") != 0 or bool(exit.get("signal"))


def record_failure(job: Job, alloc: Allocation, exit: protocol.RankExit, now: datetime) -> None:
    """Record the round's first failure, then settle it if every host has shown it is alive."""
    rnd = alloc.round
    if rnd.round_state is RoundPhase.FORMING:
        # Before its ranks re-formed in place: the in-place change failed, not the job.
        what = describe({"signal": exit.get("signal"), "exit_code": exit.get("exit_code")})
        said = (exit.get("error") or "").strip().splitlines()
        why = f": {said[-1][:300]}" if said else ""
        fall_back(job, rnd, f"rank {exit.get('rank')} on {alloc.node.name} ended with {what}{why}")
        return
    if alloc.is_live:
        alloc.set_state(AllocationState.FAILED)
        alloc.save(update_fields=["state"])
    if rnd.round_state is RoundPhase.SETTLING:
        settle_failure(job, rnd)  # this report may be the proof of life that was missing
        return
    cause = {
        "round": rnd.number,
        "node": alloc.node.name,
        "rank": exit.get("rank"),
        "local_rank": exit.get("local_rank"),
        "exit_code": exit.get("exit_code"),
        "signal": exit.get("signal"),
        "error": (exit.get("error") or "")[-4000:],
    }
    rnd.failure = cause
    rnd.save(update_fields=["failure", *rnd.set_state(RoundPhase.SETTLING, at=now)])
    # Its next heartbeat is the proof of life the settlement waits for: ask for it now, and a
    # host that does not answer within PING_DEADLINE is declared lost (it may be the cause).
    suspect(unproven(rnd))
    events.emit(
        "rank.failed",
        f"Rank {cause['rank']} on {cause['node']} failed with {describe(cause)}",
        job=job,
        node=alloc.node,
        severity=Severity.ERROR,
        cause=cause,
    )
    settle_failure(job, rnd)


def describe(cause: dict[str, Any]) -> str:
    return f"signal {cause['signal']}" if cause["signal"] else f"exit code {cause['exit_code']}"


def settle_failure(job: Job, rnd: Round) -> None:
    """Restart (charged) or fail a job whose current round is settling a rank failure."""
    if job.round_number != rnd.number or rnd.state != RoundPhase.SETTLING or not job.job_state.is_active:
        return
    if unproven(rnd):
        return  # a host has not shown it is alive since the failure: it may be the cause
    cause = rnd.failure
    if job.restarts >= job.max_restarts:
        job.failure = cause
        finish_job(
            job,
            JobState.FAILED,
            f"Failed: rank {cause['rank']} on {cause['node']} ({describe(cause)}) after {job.restarts} restart(s)",
            severity=Severity.ERROR,
            cause=cause,
        )
        return
    change_membership(job, RoundReason.FAILURE)


def unproven(rnd: Round) -> list[Node]:
    """The round's hosts, still thought alive, that have not shown they are since its failure: no
    report or heartbeat after it, nor (in place) ranks reporting they wait for the next round,
    which means they saw the failure's broken collective."""
    assert rnd.failed_at is not None
    failed_at = rnd.failed_at
    alive_states = (NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED)
    waiting = set(rnd.allocations.filter(inplace=InplaceStatus.WAITING).values_list("node_id", flat=True))
    return [
        n
        for n in members(rnd)
        if n.state in alive_states
        and n.pk not in waiting
        and (n.last_heartbeat is None or n.last_heartbeat < failed_at)
    ]


def settle_failed_rounds() -> None:
    """The tick's pass over failures still waiting for proof of life."""
    waiting = Round.objects.filter(
        state=RoundPhase.SETTLING,
        number=F("job__round_number"),
        job__state__in=[s.value for s in JobState if s.is_active],
    ).values_list("job_id", flat=True)
    for job_id in list(waiting):
        with decision():
            job = Job.lock(job_id)
            rnd = job.current_round()
            if rnd is not None:
                settle_failure(job, rnd)


def refund_failures_caused_by(job: Job, node: Node, last_seen: datetime | None) -> None:
    """Rank failures right after a node died (or its agent restarted) were the node's loss, not
    the job's fault.

    settle_failure already waits for every host to show it is alive before charging, but a
    heartbeat the host sent just before dying can be processed after the failure and look like
    that proof; this undoes such a charge when the host is then declared gone. ``last_seen`` is
    the host's last sign of life before it went (its last heartbeat).
    """
    since = (last_seen or timezone.now()) - timedelta(seconds=settings.HEARTBEAT_INTERVAL)
    charged = job.rounds.filter(charged=True, reason=RoundReason.FAILURE, created_at__gte=since)
    refunded = charged.update(charged=False)
    if refunded:
        job.restarts = max(0, job.restarts - refunded)
        job.save(update_fields=["restarts"])
