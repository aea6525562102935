"""What this host does for each job, as state machines: a job's `JobSlot` (`SlotState`), the round
it runs (`LocalRound`, `LocalState`) and that round's ranks (`Rank`, protocol.RankState).

Each moves only through its ``set_state``, which checks its table. An illegal move is a bug in the
supervisor's decisions; it is logged as an error and refused (the record keeps its state) rather
than raised, so that one wrong decision cannot kill the loop that watches every rank on the host.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from workers.agent.launcher import RankFiles, RankHandler
from workers.protocol import InplaceStatus, RankExit, RankState, RoundSpec, RoundState

logger = logging.getLogger(__name__)


class LocalState(StrEnum):
    """Where a round on this host is in its life.

    STARTING: fetching its bundle, or launching its ranks.
    LAUNCH_FAILED: the launch failed; the ranks that did start were SIGKILLed; it ends FAILED
        once they are reaped.
    RUNNING: every rank launched.
    STOPPING: told to stop (command, sync, shutdown): SIGTERM sent, the grace period runs. A round
        told to stop while fetching its bundle waits here for the fetch, then ends STOPPED.
    FAILING: a rank failed: the others got SIGTERM, the grace period runs.
    KILLING, KILLING_FAILED: the grace period of STOPPING, FAILING is over: SIGKILL sent.
    SUCCEEDED, FAILED, STOPPED: ended (the outcome sent to the controller).
    """

    STARTING = "starting"
    LAUNCH_FAILED = "launch_failed"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILING = "failing"
    KILLING = "killing"
    KILLING_FAILED = "killing_failed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_final(self) -> bool:
        return self in (LocalState.SUCCEEDED, LocalState.FAILED, LocalState.STOPPED)

    @property
    def is_ending(self) -> bool:
        """Its ranks are being stopped (or were never all started): an exit is not reported."""
        return self in ENDING

    @property
    def reported(self) -> RoundState:
        """The state the controller sees in heartbeats (workers/protocol.py)."""
        return REPORTED[self]


ENDING = frozenset(
    {
        LocalState.LAUNCH_FAILED,
        LocalState.STOPPING,
        LocalState.FAILING,
        LocalState.KILLING,
        LocalState.KILLING_FAILED,
    }
)

REPORTED: dict[LocalState, RoundState] = {
    LocalState.STARTING: RoundState.STARTING,
    LocalState.LAUNCH_FAILED: RoundState.STARTING,
    LocalState.RUNNING: RoundState.RUNNING,
    LocalState.STOPPING: RoundState.STOPPING,
    LocalState.FAILING: RoundState.STOPPING,
    LocalState.KILLING: RoundState.STOPPING,
    LocalState.KILLING_FAILED: RoundState.STOPPING,
    LocalState.SUCCEEDED: RoundState.SUCCEEDED,
    LocalState.FAILED: RoundState.FAILED,
    LocalState.STOPPED: RoundState.STOPPED,
}

LOCAL_TRANSITIONS: dict[LocalState, frozenset[LocalState]] = {
    LocalState.STARTING: frozenset({LocalState.RUNNING, LocalState.LAUNCH_FAILED, LocalState.STOPPING}),
    # A stop for a round whose launch failed: its ranks were SIGKILLed already.
    LocalState.LAUNCH_FAILED: frozenset({LocalState.KILLING, LocalState.FAILED}),
    LocalState.RUNNING: frozenset({LocalState.STOPPING, LocalState.FAILING, LocalState.SUCCEEDED}),
    LocalState.STOPPING: frozenset({LocalState.KILLING, LocalState.STOPPED}),
    # A stop command outranks a failure: the round then ends STOPPED (as torchrun's agent would).
    LocalState.FAILING: frozenset({LocalState.STOPPING, LocalState.KILLING_FAILED, LocalState.FAILED}),
    LocalState.KILLING: frozenset({LocalState.STOPPED}),
    LocalState.KILLING_FAILED: frozenset({LocalState.KILLING, LocalState.FAILED}),
    LocalState.SUCCEEDED: frozenset(),
    LocalState.FAILED: frozenset(),
    LocalState.STOPPED: frozenset(),
}


def refused(what: str, current: StrEnum, new: StrEnum) -> bool:
    logger.error("%s: illegal move %s -> %s refused", what, current, new)
    return False


@dataclass
class Rank:
    local_rank: int
    rank: int
    files: RankFiles
    handler: RankHandler
    state: RankState = RankState.RUNNING
    killed_in_teardown: bool = False
    origin_round: int = -1  # the round it was started for (its files live there)

    @property
    def pid(self) -> int:
        return self.handler.proc.pid

    def set_state(self, new: RankState) -> bool:
        """Moves to ``new`` if protocol.RANK_TRANSITIONS allows it (the current state: a no-op);
        an illegal move is logged and refused. Returns whether the rank is now in ``new``."""
        if new is self.state:
            return True
        if not self.state.can_become(new):
            return refused(f"rank {self.rank} (pid {self.pid})", self.state, new)
        self.state = new
        return True


@dataclass(frozen=True)
class InplaceReport:
    """An in-place round's progress on this host, from its ranks' SDK state files
    (monitor.inplace_state): what a heartbeat reports as RoundStatus.inplace."""

    status: InplaceStatus
    reason: str = ""
    formed_at: float | None = None  # when the last local rank formed the round (FORMED)


@dataclass
class LocalRound:
    spec: RoundSpec
    state: LocalState = LocalState.STARTING
    ranks: list[Rank] = field(default_factory=list)
    fetch: Future[Path | None] | None = None  # the bundle being fetched (a handle, not a state)
    stop_deadline: float = 0.0  # monotonic; SIGKILL once passed (STOPPING, FAILING)
    failures: list[RankExit] = field(default_factory=list)
    inplace: InplaceReport | None = None  # in-place rounds: what the ranks here said last

    @property
    def reports_inplace(self) -> bool:
        """Its ranks report how far they are in place (their SDK state files): carried over, or
        recovered in place after a failure."""
        return "carry_over" in self.spec or bool(self.spec.get("recover_in_place"))

    @property
    def job_id(self) -> int:
        return self.spec["job_id"]

    @property
    def number(self) -> int:
        return self.spec["round"]

    def set_state(self, new: LocalState) -> bool:
        """Moves to ``new`` if the table allows it (moving to the current state is a no-op);
        an illegal move is logged and refused. Returns whether the round is now in ``new``."""
        if new is self.state:
            return True
        if new not in LOCAL_TRANSITIONS[self.state]:
            return refused(f"job {self.job_id} round {self.number}", self.state, new)
        self.state = new
        return True


class SlotState(StrEnum):
    """What this host does for one job.

    IDLE: no round of the job runs here (none yet, or the last one ended: ``last_ended``).
    RUNNING: ``active`` is the job's round here; its `LocalState` says how far (starting, running,
        or being stopped with nothing to follow it).
    REPLACING: ``active`` is being stopped for a newer round, ``pending``, which is launched once
        every rank of ``active`` has ended.
    CLOSING: the agent shuts down: ``active`` is being stopped and nothing starts after it.
    """

    IDLE = "idle"
    RUNNING = "running"
    REPLACING = "replacing"
    CLOSING = "closing"


SLOT_TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    SlotState.IDLE: frozenset({SlotState.RUNNING}),
    # An in-place round takes over ``active`` without leaving RUNNING.
    SlotState.RUNNING: frozenset({SlotState.IDLE, SlotState.REPLACING, SlotState.CLOSING}),
    # RUNNING again: the pending round was launched, or a stop command cancelled it.
    SlotState.REPLACING: frozenset({SlotState.RUNNING, SlotState.CLOSING}),
    SlotState.CLOSING: frozenset({SlotState.IDLE}),
}


@dataclass
class JobSlot:
    """One job on this host: its `SlotState`, the round it runs, the round waiting to start, and
    its fencing (which rounds must never start here). Only its methods move it; each keeps
    ``active`` set exactly when not IDLE and ``pending`` exactly when REPLACING."""

    newest: int = -1  # newest round any command named
    fenced_upto: int = -1  # rounds up to this one were stopped and must not start again
    state: SlotState = SlotState.IDLE
    active: LocalRound | None = None  # starting, running or stopping
    pending: RoundSpec | None = None  # starts once `active` has fully stopped
    last_ended: LocalRound | None = None

    def set_state(self, new: SlotState) -> bool:
        """Moves to ``new`` if SLOT_TRANSITIONS allows it (the current state: a no-op); an illegal
        move is logged and refused. Returns whether the slot is now in ``new``."""
        if new is self.state:
            return True
        if new not in SLOT_TRANSITIONS[self.state]:
            return refused(f"job slot (newest round {self.newest})", self.state, new)
        self.state = new
        return True

    def run(self, local: LocalRound) -> None:
        """``local`` is launched (IDLE, or REPLACING once the old round ended), or took over the
        active round in place (RUNNING)."""
        if self.set_state(SlotState.RUNNING):
            self.active, self.pending = local, None

    def replace(self, spec: RoundSpec) -> None:
        """Start ``spec`` once the active round (being stopped) has ended."""
        if self.set_state(SlotState.REPLACING):
            self.pending = spec

    def cancel(self, upto: int) -> None:
        """A stop for rounds up to ``upto``: a pending round among them never starts."""
        if self.pending is not None and self.pending["round"] <= upto and self.set_state(SlotState.RUNNING):
            self.pending = None

    def close(self) -> None:
        """The agent shuts down: nothing starts after the active round (being stopped)."""
        if self.active is not None and self.set_state(SlotState.CLOSING):
            self.pending = None

    def ended(self, local: LocalRound) -> RoundSpec | None:
        """The active round ended; returns the pending round to launch, if there is one."""
        self.last_ended = local
        if self.state is SlotState.REPLACING:
            self.active = None
            return self.pending  # launched by the caller, then ``run``
        if self.set_state(SlotState.IDLE):
            self.active = None
        return None

    def held_rounds(self) -> list[int]:
        """The rounds this host still holds for the job: active, last ended, pending, and those
        whose directories hold the files of ranks carried into the active round (in place)."""
        held = [local.number for local in (self.active, self.last_ended) if local is not None]
        if self.active is not None:
            held += sorted({r.origin_round for r in self.active.ranks if r.origin_round >= 0} - set(held))
        if self.pending is not None:
            held.append(self.pending["round"])
        return held
