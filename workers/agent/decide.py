"""Decisions about a round on this host: pure functions from a `LocalRound` and what monitor.py
observed to the actions the supervisor carries out, in order. Nothing here signals, sends or
launches; the round passed in is not changed.

- `decide_stop`: a stop (command, sync, shutdown) or a rank's failure: SIGTERM, grace period.
- `decide_tick`: one look at the round: spawn once the bundle is fetched, reap ended ranks and
  report their exits (a failure fails the round, like torchrun's local agent, unless the round is
  recovered in place: the other ranks then wait for the controller's next round; a rank that then
  ends with a failing status of its own, not by the stop, is reported too), SIGKILL a rank
  whose interpreter hangs in its teardown, SIGKILL every rank once the grace period is over, end
  the round once no rank runs; keep what an in-place round's ranks say (`NoteInplace`) and, when
  they start waiting for the next round after a peer's failure, tell the controller at once
  (`Poke`: the heartbeat that says so is the host's proof of life for the failure's settlement).
  A round ends FAILED if one of its ranks failed; a parameter-server round's part stays open until
  the controller ends it (`held_open`).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from workers.agent.launcher import removed, survivable
from workers.agent.lifecycle import InplaceReport, LocalRound, LocalState, Rank
from workers.agent.monitor import Observation, RankEnded
from workers.protocol import InplaceStatus, RankExit, RankState


class StopReason(StrEnum):
    COMMAND = "command"  # stop, sync, shutdown, or a newer round of the job
    FAILURE = "failure"  # a local rank failed


@dataclass(frozen=True)
class Move:
    """LocalRound.set_state."""

    state: LocalState


@dataclass(frozen=True)
class SetDeadline:
    at: float  # monotonic


@dataclass(frozen=True)
class Kill:
    """Signal the rank's process group."""

    rank: Rank
    signum: signal.Signals


@dataclass(frozen=True)
class KillInTeardown:
    """SIGKILL a rank whose code ended ``since`` seconds ago but whose interpreter has not exited."""

    rank: Rank
    since: float


@dataclass(frozen=True)
class Reap:
    """A rank's process has ended: SIGKILL what it left in its group, stop watching it."""

    rank: Rank
    ended: RankEnded
    state: RankState


@dataclass(frozen=True)
class ReportExit:
    """CONTROL_RANK_EXITED; a failed exit is also one of the round's failures."""

    exit: RankExit
    failed: bool


@dataclass(frozen=True)
class Spawn:
    bundle_dir: Path | None


@dataclass(frozen=True)
class FailLaunch:
    message: str


@dataclass(frozen=True)
class End:
    """CONTROL_ROUND_ENDED with this outcome; the job's pending round may start."""

    outcome: LocalState


@dataclass(frozen=True)
class NoteInplace:
    """LocalRound.inplace: what the round's ranks here said last (heartbeats report it)."""

    report: InplaceReport


@dataclass(frozen=True)
class Poke:
    """Heartbeat now rather than at the end of the interval."""


Action = (
    Move
    | SetDeadline
    | Kill
    | KillInTeardown
    | Reap
    | ReportExit
    | Spawn
    | FailLaunch
    | End
    | NoteInplace
    | Poke
)

OUTCOMES: dict[LocalState, LocalState] = {
    LocalState.RUNNING: LocalState.SUCCEEDED,
    LocalState.LAUNCH_FAILED: LocalState.FAILED,
    LocalState.STOPPING: LocalState.STOPPED,
    LocalState.KILLING: LocalState.STOPPED,
    LocalState.FAILING: LocalState.FAILED,
    LocalState.KILLING_FAILED: LocalState.FAILED,
}

STOPPED_BY: dict[tuple[LocalState, StopReason], LocalState] = {
    (LocalState.STARTING, StopReason.COMMAND): LocalState.STOPPING,
    (LocalState.RUNNING, StopReason.COMMAND): LocalState.STOPPING,
    (LocalState.RUNNING, StopReason.FAILURE): LocalState.FAILING,
    (LocalState.LAUNCH_FAILED, StopReason.COMMAND): LocalState.KILLING,
    (LocalState.FAILING, StopReason.COMMAND): LocalState.STOPPING,
    (LocalState.KILLING_FAILED, StopReason.COMMAND): LocalState.KILLING,
}

KILLING: dict[LocalState, LocalState] = {
    LocalState.STOPPING: LocalState.KILLING,
    LocalState.FAILING: LocalState.KILLING_FAILED,
}


FAILURE_STOPS = (LocalState.FAILING, LocalState.KILLING_FAILED)


def failed_on_its_own(local: LocalRound, rank: Rank, end: RankEnded) -> bool:
    """A rank that ended with an exit status of its own (its code failed: no signal ended it),
    in a round being stopped for a failure: the SIGTERM did not end it."""
    exit_code = end.exit["exit_code"]
    return (
        end.exit["signal"] is None
        and exit_code not in (0, None)
        and not removed(local.spec, rank.local_rank)
        and not survivable(local.spec, rank.local_rank)
    )


def decide_stop(
    local: LocalRound,
    reason: StopReason,
    grace: float,
    now: float,
    running: list[Rank] | None = None,
) -> list[Action]:
    """Stop the round: the first stop sends SIGTERM to every running rank (``running``, by default
    those whose state is RUNNING) and starts the grace period; a later one only shortens it, and a
    command outranks a failure (the round then ends STOPPED)."""
    state = local.state
    if state.is_final:
        return []
    deadline = now + max(0.0, grace)
    new = STOPPED_BY.get((state, reason), state)
    if not state.is_ending:
        if running is None:
            running = [rank for rank in local.ranks if rank.state == RankState.RUNNING]
        return [Move(new), SetDeadline(deadline), *(Kill(rank, signal.SIGTERM) for rank in running)]
    return [Move(new), SetDeadline(min(local.stop_deadline, deadline))]


def note_inplace(local: LocalRound, seen: InplaceReport | None) -> list[Action]:
    """Keep a changed in-place word; a round recovered in place whose ranks here start waiting
    (a peer failed) pokes the heartbeat."""
    if seen is None or seen == local.inplace:
        return []
    before = local.inplace.status if local.inplace is not None else None
    starts_waiting = seen.status is InplaceStatus.WAITING and before is not InplaceStatus.WAITING
    poke: list[Action] = [Poke()] if starts_waiting and local.spec.get("recover_in_place") else []
    return [NoteInplace(seen), *poke]


def decide_tick(
    local: LocalRound, seen: Observation, now: float, grace: float, teardown_timeout: float
) -> list[Action]:
    """What to do about the round, given one observation of it at ``now`` (monotonic)."""
    if seen.fetching:
        return []
    if seen.fetched is not None and local.state is LocalState.STARTING:
        if seen.fetched.error:
            return [FailLaunch(seen.fetched.error)]
        return [Spawn(seen.fetched.bundle_dir)]
    # (A fetch that finished for a round told to stop meanwhile is dropped: nothing is spawned.)
    state, deadline = local.state, local.stop_deadline
    running = {rank.local_rank: rank for rank in local.ranks if rank.state == RankState.RUNNING}
    actions: list[Action] = note_inplace(local, seen.inplace)
    ended = [look for look in seen.ranks if look.ended is not None]
    for look in ended:
        del running[look.rank.local_rank]
    if state.is_ending:
        for look in ended:
            assert look.ended is not None
            if state in FAILURE_STOPS and failed_on_its_own(local, look.rank, look.ended):
                # It raised before the stop reached it (its exit only came later than a peer's):
                # a failure too, often the root cause, not a rank we stopped.
                actions.append(Reap(look.rank, look.ended, RankState.FAILED))
                actions.append(ReportExit(look.ended.exit, True))
            else:
                actions.append(Reap(look.rank, look.ended, RankState.STOPPED))
    else:
        # Every rank seen ended here ended on its own (no signal was sent yet): each is reported,
        # earliest first, so a failure's root cause comes before the peers it took down.
        fails = False
        for look in sorted(ended, key=lambda seen_rank: seen_rank.ended.ended_at if seen_rank.ended else 0.0):
            rank, end = look.rank, look.ended
            assert end is not None
            if removed(local.spec, rank.local_rank):
                # A parameter-server worker taken out of the round: stopped by us.
                actions.append(Reap(rank, end, RankState.STOPPED))
                continue
            failed = not end.succeeded
            # A parameter-server worker's failure costs its round nothing (launcher.survivable).
            fails_round = failed and not survivable(local.spec, rank.local_rank)
            actions.append(Reap(rank, end, RankState.FAILED if failed else RankState.SUCCEEDED))
            actions.append(ReportExit(end.exit, fails_round))
            fails = fails or fails_round
        # A round recovered in place keeps the failed rank's local peers: their SDK waits for
        # the controller's next round, which carries them over and replaces only the dead rank.
        keeps_peers = bool(local.spec.get("recover_in_place")) and bool(running)
        if fails and not keeps_peers:
            stop = decide_stop(local, StopReason.FAILURE, grace, now, list(running.values()))
            actions.extend(stop)
            state = LocalState.FAILING
            deadline = next(a.at for a in stop if isinstance(a, SetDeadline))
    for look in seen.ranks:
        if (
            look.ended is None
            and look.code_ended_ago is not None
            and look.code_ended_ago >= teardown_timeout
            and not state.is_ending
            and not look.rank.killed_in_teardown
        ):
            actions.append(KillInTeardown(look.rank, look.code_ended_ago))
    if running and state in KILLING and now >= deadline:
        state = KILLING[state]
        actions.append(Move(state))
        actions.extend(Kill(rank, signal.SIGKILL) for rank in running.values())
    if not running and state is LocalState.RUNNING:
        if held_open(local):
            return actions
        # The last rank here ended after a peer failed earlier (kept for an in-place recovery
        # that did not come), or a rank that ended now failed: the round failed. A rank that
        # exited non-zero never ends its round as succeeded.
        if any(rank.state == RankState.FAILED for rank in local.ranks) or any(
            isinstance(action, Reap) and action.state == RankState.FAILED for action in actions
        ):
            actions.append(Move(LocalState.FAILING))
            state = LocalState.FAILING
    if not running and state is not LocalState.STARTING:
        actions.append(End(OUTCOMES[state]))
    return actions


def held_open(local: LocalRound) -> bool:
    """A parameter-server round's part on this host stays open once its ranks have all ended
    (only workers end on their own): the controller may start more workers here in the same
    round (a resize, a hybrid job's new dense group), and it ends the round itself (the job's
    end, or a new round)."""
    return "ps" in local.spec
