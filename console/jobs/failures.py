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
from console.jobs.backoff import PastRound, false_starts, launch_failures_in_a_row, launch_kind, restart_delay
from console.jobs.inplace import fall_back
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job, Round
from console.jobs.rounds import finish_job
from console.jobs.snapshot import members
from workers import protocol
from workers.protocol import InplaceStatus

BACKOFF_HISTORY = 32  # rounds looked back at: past 2**30 s of back-off the count no longer matters


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
    kind = launch_kind(exit, rnd.first_step_at is not None)
    if kind:
        cause["launch"] = kind
    rnd.failure = cause
    rnd.save(update_fields=["failure", *rnd.set_state(RoundPhase.SETTLING, at=now)])
    # Its next heartbeat is the proof of life the settlement waits for: ask for it now, and a
    # host that does not answer within PING_DEADLINE is declared lost (it may be the cause).
    suspect(unproven(rnd))
    if kind:
        events.emit(
            "round.launch_failed",
            f"Round {rnd.number} could not start on {cause['node']}: {launch_reason(cause)}",
            job=job,
            node=alloc.node,
            severity=Severity.ERROR,
            cause=cause,
        )
        settle_failure(job, rnd)
        return
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


def launch_reason(cause: dict[str, Any]) -> str:
    """The last line of a launch failure's error (the agent's message, or the rank's exception)."""
    lines = [line.strip() for line in str(cause.get("error") or "").splitlines() if line.strip()]
    reason = lines[-1] if lines else describe(cause)
    return reason.removeprefix("launch failed: ")[:300]


def settle_failure(job: Job, rnd: Round) -> None:
    """Restart or fail a job whose current round is settling a rank failure: a rank failure is
    charged against max_restarts, a launch failure is not (LAUNCH_FAILURE_LIMIT in a row fail
    the job); a restart after a round that never got going waits (console/jobs/backoff.py)."""
    if job.round_number != rnd.number or rnd.state != RoundPhase.SETTLING or not job.job_state.is_active:
        return
    if unproven(rnd):
        return  # a host has not shown it is alive since the failure: it may be the cause
    cause = rnd.failure
    history = past_rounds(job)
    if cause.get("launch"):
        in_a_row = launch_failures_in_a_row(history, RoundReason.FAILURE)
        if in_a_row >= settings.LAUNCH_FAILURE_LIMIT:
            job.failure = cause
            finish_job(
                job,
                JobState.FAILED,
                f"Failed: round {cause['round']} could not start on {cause['node']} ({launch_reason(cause)}); "
                f"{in_a_row} launch failures in a row",
                severity=Severity.ERROR,
                cause=cause,
            )
            return
    elif job.restarts >= job.max_restarts:
        job.failure = cause
        finish_job(
            job,
            JobState.FAILED,
            f"Failed: rank {cause['rank']} on {cause['node']} ({describe(cause)}) after {job.restarts} restart(s)",
            severity=Severity.ERROR,
            cause=cause,
        )
        return
    if backing_off(job, rnd, history):
        return
    plan = change_membership(job, RoundReason.FAILURE)
    if cause.get("launch") and plan is not None and plan.charged:
        # The host's configuration, not the job's code: the restart is not counted.
        job.restarts = max(0, job.restarts - 1)
        job.save(update_fields=["restarts"])
        if not plan.requeue:
            Round.objects.filter(job=job, number=job.round_number).update(charged=False)


def past_rounds(job: Job) -> list[PastRound]:
    """The job's latest rounds, newest first, as back-off sees them."""
    rows = job.rounds.order_by("-number").values_list(
        "reason", "created_at", "first_step_at", "failed_at", "failure"
    )[:BACKOFF_HISTORY]
    return [
        PastRound(reason, created, first is not None, failed_at, bool((failure or {}).get("launch")))
        for reason, created, first, failed_at, failure in rows
    ]


def backing_off(job: Job, rnd: Round, history: list[PastRound]) -> bool:
    """True while the restart after ``rnd``'s failure must wait (the tick settles it later); the
    first time, says so in an event and on the round's failure (``retry_at``)."""
    streak = false_starts(history, settings.RESTART_BACKOFF_RESET, RoundReason.FAILURE)
    delay = restart_delay(streak, settings.RESTART_BACKOFF_BASE, settings.RESTART_BACKOFF_MAX)
    if not delay or rnd.failed_at is None:
        return False
    retry_at = rnd.failed_at + timedelta(seconds=delay)
    if timezone.now() >= retry_at:
        return False
    if "retry_at" not in rnd.failure:
        rnd.failure = {**rnd.failure, "retry_at": retry_at.isoformat(), "false_starts": streak}
        rnd.save(update_fields=["failure"])
        events.emit(
            "job.backoff",
            f"{streak} failures in a row before the job got going: restarting in {delay:g} s",
            job=job,
            severity=Severity.WARNING,
            delay=delay,
            false_starts=streak,
            retry_at=retry_at.isoformat(),
        )
    return True


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
