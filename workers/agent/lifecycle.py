"""A round on this host and its lifecycle: the `LocalState` enum, its transition table, and the
records the supervisor keeps per rank, per round and per job.

`LocalRound.set_state` is the only way a round's state moves. An illegal move is a bug in the
supervisor's decisions; it is logged as an error and refused (the round keeps its state) rather
than raised, so that one wrong decision cannot kill the loop that watches every rank on the host.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from workers.agent.launcher import RankFiles, RankHandler
from workers.protocol import RankExit, RankState, RoundSpec, RoundState

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


@dataclass
class LocalRound:
    spec: RoundSpec
    state: LocalState = LocalState.STARTING
    ranks: list[Rank] = field(default_factory=list)
    fetch: Future[Path | None] | None = None  # the bundle being fetched (a handle, not a state)
    stop_deadline: float = 0.0  # monotonic; SIGKILL once passed (STOPPING, FAILING)
    failures: list[RankExit] = field(default_factory=list)

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
            logger.error(
                "job %s round %s: illegal move %s -> %s refused", self.job_id, self.number, self.state, new
            )
            return False
        self.state = new
        return True


@dataclass
class JobSlot:
    newest: int = -1  # newest round any command named
    fenced_upto: int = -1  # rounds up to this one were stopped and must not start again
    active: LocalRound | None = None  # starting, running or stopping
    pending: RoundSpec | None = None  # starts once `active` has fully stopped
    last_ended: LocalRound | None = None

    def held_rounds(self) -> list[int]:
        """The rounds this host still holds for the job: active, last ended, pending, and those
        whose directories hold the files of ranks carried into the active round (in place)."""
        held = [local.number for local in (self.active, self.last_ended) if local is not None]
        if self.active is not None:
            held += sorted({r.origin_round for r in self.active.ranks if r.origin_round >= 0} - set(held))
        if self.pending is not None:
            held.append(self.pending["round"])
        return held
