"""Agents' reports about the rounds they run: rank exits, round ends, round statuses in heartbeats.

Every report is fenced by (job, round): one for an older round, or a job that is over, changes
nothing. Every handler is safe to run twice (a redelivered task, an agent that sent again after
a send that seemed to fail): an exit already recorded is not recorded or acted on again, and
every state it moves is moved only if it has not moved yet.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from console.cluster.models import Node
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import AllocationState, JobState, RoundPhase
from console.core.transport import send_on_commit
from console.jobs import hangs, inplace, progress
from console.jobs.failures import failed, record_failure, settle_failure
from console.jobs.models import Allocation, Job, Round
from console.jobs.parameter_server import is_worker_exit, worker_exited
from console.jobs.rounds import finish_job, send_stop
from console.jobs.snapshot import live_allocations
from console.jobs.spec import round_spec
from workers import protocol
from workers.protocol import InplaceStatus, RankState, RoundState

log = logging.getLogger(__name__)

# A start command the agent has not acknowledged (no heartbeat lists the round) after this many
# seconds is sent again: covers a controller killed between commit and send.
START_RESEND_AFTER = 8.0
# What a round that ended "failed" without naming a failing rank is recorded as.
UNNAMED_FAILURE: protocol.RankExit = {
    "local_rank": -1,
    "rank": -1,
    "pid": 0,
    "exit_code": 1,
    "signal": None,
    "error": "round failed",
    "at": 0.0,
}


def _fenced_allocation(node_name: str, job_id: int, number: int) -> tuple[Job, Allocation] | None:
    """The job (locked) and the node's allocation in its current round ``number``, or None."""
    job = Job.objects.select_for_update(of=("self",)).filter(pk=job_id).first()
    if job is None or job.round_number != number or not job.job_state.is_active:
        return None  # an old round, or a job that is already over
    alloc = (
        Allocation.objects.select_for_update(of=("self",))
        .filter(round__job=job, round__number=number, node__name=node_name)
        .select_related("round", "node")
        .first()
    )
    return None if alloc is None else (job, alloc)


def rank_exited(node_name: str, job_id: int, number: int, exit: protocol.RankExit) -> None:
    with decision():
        now = timezone.now()
        Node.mark_seen(node_name, now)
        found = _fenced_allocation(node_name, job_id, number)
        if found is None:
            return
        job, alloc = found
        if not _record_exit(alloc, exit):
            return  # the same exit again: the first report already did everything below
        if exit.get("teardown"):
            _teardown_event(job, alloc, exit)
        if is_worker_exit(job, alloc, exit):
            worker_exited(job, alloc, exit, now)
        elif failed(exit):
            record_failure(job, alloc, exit, now)


def _exit_key(exit: dict[str, Any] | protocol.RankExit) -> tuple[Any, ...]:
    return (exit.get("rank"), exit.get("local_rank"), exit.get("pid"), exit.get("at"))


def _record_exit(alloc: Allocation, exit: protocol.RankExit) -> bool:
    """Append ``exit`` to the allocation's exits; False when it is there already."""
    exits: list[dict[str, Any]] = list(alloc.exit_info.get("exits", []))
    if any(_exit_key(seen) == _exit_key(exit) for seen in exits):
        return False
    exits.append(dict(exit))
    alloc.exit_info = {**alloc.exit_info, "exits": exits}
    alloc.save(update_fields=["exit_info"])
    return True


def _teardown_event(job: Job, alloc: Allocation, exit: protocol.RankExit) -> None:
    """The rank's code had ended when its interpreter's teardown crashed or hung (a torch gloo
    bug, workers/agent/runner.py): the code's exit code stands, and operators are told."""
    what = "hung and was killed" if exit["teardown"] == "hung" else f"died by {exit['teardown']}"
    events.emit(
        "rank.teardown",
        f"Rank {exit['rank']} on {alloc.node.name} ended with exit code {exit['exit_code']}, "
        f"then its interpreter {what} while tearing down; the exit code stands",
        job=job,
        node=alloc.node,
        severity=Severity.WARNING,
        rank=exit["rank"],
        exit_code=exit["exit_code"],
        teardown=exit["teardown"],
    )


def round_ended(
    node_name: str, job_id: int, number: int, outcome: str, failures: list[protocol.RankExit]
) -> None:
    try:
        state = RoundState(outcome)
    except ValueError:
        log.warning("dropping a round end from %s with an unknown outcome %r", node_name, outcome)
        return
    with decision():
        now = timezone.now()
        Node.mark_seen(node_name, now)
        found = _fenced_allocation(node_name, job_id, number)
        if found is None:
            return
        job, alloc = found
        if state is RoundState.SUCCEEDED:
            _host_succeeded(job, alloc)
        elif state is RoundState.FAILED:
            record_failure(job, alloc, failures[0] if failures else UNNAMED_FAILURE, now)


def _host_succeeded(job: Job, alloc: Allocation) -> None:
    if not alloc.allocation_state.can_become(AllocationState.SUCCEEDED):
        return  # already SUCCEEDED (a redelivery), or ended otherwise
    alloc.set_state(AllocationState.SUCCEEDED)
    alloc.save(update_fields=["state"])
    if not alloc.round.allocations.exclude(state=AllocationState.SUCCEEDED).exists():
        finish_job(job, JobState.SUCCEEDED, f"Succeeded in round {alloc.round.number}")


def apply_round_statuses(node: Node, rounds: list[protocol.RoundStatus]) -> None:
    """A heartbeat's round statuses: stop strays, promote allocations, record progress, and send
    again a start the agent never got."""
    reported = {(int(r["job_id"]), int(r["round"])): r for r in rounds}
    for (job_id, number), status in reported.items():
        if not RoundState(status["state"]).is_final:
            _stop_if_stray(node, job_id, number)
    for alloc in live_allocations().filter(node=node).select_related("round__job__bundle"):
        rnd, job = alloc.round, alloc.round.job
        found = reported.get((job.pk, rnd.number))
        if found is None:
            _resend_start_if_lost(node, job, rnd, alloc)
        else:
            # The round before, if the agent still lists it: its last steps (logged after its
            # last heartbeat) are where the job is until this round logs its own.
            _apply_status(job.pk, rnd.number, alloc.pk, found, reported.get((job.pk, rnd.number - 1)))


def _stop_if_stray(node: Node, job_id: int, number: int) -> None:
    """A round the agent runs that it should not (a lost stop command, or fencing): stop it."""
    job = Job.objects.filter(pk=job_id).only("id", "state", "round_number", "grace_period").first()
    live = (
        job is not None
        and job.job_state.is_active
        and job.round_number == number
        and Allocation.objects.filter(round__job=job, round__number=number, node=node).exists()
    )
    if not live and job is not None and job.job_state.is_active and _carried_over(job, number, node):
        return  # its ranks carry over into the current round, whose start may still be on its way
    if not live:
        send_stop(node, job_id, number, job.grace_period if job else 5.0)


def _carried_over(job: Job, number: int, node: Node) -> bool:
    """The job's current round is in place from round ``number`` and keeps ``node``."""
    current = Round.objects.filter(job=job, number=job.round_number, inplace=True).first()
    if current is None:
        return False
    return (
        int(current.carry_over["from_round"]) == number
        and Allocation.objects.filter(round__job=job, round__number=job.round_number, node=node).exists()
    )


def _resend_start_if_lost(node: Node, job: Job, rnd: Round, alloc: Allocation) -> None:
    age = (timezone.now() - rnd.created_at).total_seconds()
    if age > START_RESEND_AFTER and alloc.state == AllocationState.ASSIGNED:
        log.info("re-sending start of job %s round %s to %s", job.pk, rnd.number, node.name)
        send_on_commit(protocol.AGENT_START_ROUND, node.queue, spec=round_spec(job, rnd, alloc))


def _apply_status(
    job_id: int,
    number: int,
    alloc_id: int,
    status: protocol.RoundStatus,
    before: protocol.RoundStatus | None = None,
) -> None:
    state = RoundState(status["state"])
    with decision():
        job = Job.lock(job_id)
        if job.round_number != number or not job.job_state.is_active:
            return
        alloc = Allocation.objects.select_for_update().get(pk=alloc_id)
        if state.is_final:
            _repair_lost_end(job, alloc, state, status)
            return
        rnd = alloc.round
        if inplace.record_status(job, alloc, status):
            return  # it did not form: a fallback round replaced it
        if rnd.state == RoundPhase.SETTLING and inplace.inplace_status(status) is InplaceStatus.WAITING:
            settle_failure(job, rnd)  # this host's ranks wait: its proof of life
            if job.round_number != number:
                return  # the failure was settled: a new round replaced this one
        if state in (RoundState.RUNNING, RoundState.STARTING) and alloc.state == AllocationState.ASSIGNED:
            alloc.set_state(AllocationState.RUNNING)
            alloc.save(update_fields=["state"])
        if state is RoundState.RUNNING and rnd.state == RoundPhase.STARTING:
            rnd.save(update_fields=rnd.set_state(RoundPhase.RUNNING))
        changed = False
        if state is RoundState.RUNNING and job.state != JobState.RUNNING:
            job.set_state(JobState.RUNNING)
            changed = True
            events.emit("job.running", f"Running round {number}", job=job)
        changed = _record_progress(job, alloc, status, before) or changed
        steps = status.get("rank_steps") or {}
        if steps != alloc.rank_steps:
            alloc.rank_steps = steps
            alloc.save(update_fields=["rank_steps"])
            hangs.check_drift(job, number)
        if changed:
            job.save(update_fields=["state", "progress"])
            events.job_changed(job)


def _repair_lost_end(job: Job, alloc: Allocation, state: RoundState, status: protocol.RoundStatus) -> None:
    """A heartbeat says the host's part of the current round has ended while its allocation is
    still live: the round-end (and perhaps rank-exit) reports were lost (a broker restart with
    the task unacknowledged, a controller killed mid-task). Act as the lost report would have."""
    if not alloc.is_live:
        return  # the end was reported and acted on
    if state is RoundState.SUCCEEDED:
        log.info(
            "job %s round %s: %s ended without a report; repairing",
            job.pk,
            alloc.round.number,
            alloc.node.name,
        )
        _host_succeeded(job, alloc)
    elif state is RoundState.FAILED:
        log.info(
            "job %s round %s: %s failed without a report; repairing",
            job.pk,
            alloc.round.number,
            alloc.node.name,
        )
        # The failure happened before the heartbeat that reports it, which is its host's proof
        # of life: the failure can be settled now if the other hosts have shown theirs.
        at = alloc.node.last_heartbeat or timezone.now()
        record_failure(job, alloc, _failure_from(alloc, status), at)
    # STOPPED: the controller stopped it, and whatever stopped it moves the allocation.


def _failure_from(alloc: Allocation, status: protocol.RoundStatus) -> protocol.RankExit:
    """The failing exit a lost round end would have named: one already recorded, else the first
    rank the heartbeat shows FAILED."""
    for seen in alloc.exit_info.get("exits", []):
        if failed(seen):
            return seen  # type: ignore[no-any-return]
    for rank in status["ranks"]:
        if RankState(rank["state"]) is RankState.FAILED:
            return {
                "local_rank": rank["local_rank"],
                "rank": rank["rank"],
                "pid": rank["pid"],
                "exit_code": None,
                "signal": None,
                "error": "rank failed (its exit report was lost)",
                "at": 0.0,
            }
    return UNNAMED_FAILURE


def _record_progress(
    job: Job, alloc: Allocation, status: protocol.RoundStatus, before: protocol.RoundStatus | None
) -> bool:
    """The round's progress onto the job (console/jobs/progress.py), and its first step's time
    onto the round."""
    changed = progress.record_heartbeat(job, alloc, status, before)
    first = status.get("first_step_at")
    if first:
        first_at = datetime.fromtimestamp(float(first), tz=timezone.get_current_timezone())
        Round.objects.filter(pk=alloc.round_id, first_step_at__isnull=True).update(first_step_at=first_at)
    return changed
