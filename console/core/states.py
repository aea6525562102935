"""The console's state machines, one enum and one transition table each, and why rounds start.

Every record that has a life (job, node, round, allocation) moves only through ``set_state`` on
its model, which checks the table here and raises IllegalTransition. Moving to
the state a record is already in is a no-op, not a transition (a redelivered report must not fail).
The agent's own round and rank states are workers/protocol.py's RoundState and RankState.
"""

from __future__ import annotations

from django.db import models


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: str, new: str) -> None:
        super().__init__(f"{kind} cannot go from {current} to {new}")
        self.current = current
        self.new = new


# --- job ------------------------------------------------------------------------------------


class JobState(models.TextChoices):
    """PENDING → STARTING → RUNNING ⇄ (RESIZING | RESTARTING) → SUCCEEDED | FAILED | STOPPED.

    RUNNING → PENDING when too few nodes remain (progress is kept). Terminal states stay.
    """

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESIZING = "RESIZING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_terminal(self) -> bool:
        return not JOB_TRANSITIONS[self]

    @property
    def is_active(self) -> bool:
        """Has a round whose ranks may be running on some node."""
        return self in (JobState.STARTING, JobState.RUNNING, JobState.RESIZING, JobState.RESTARTING)

    def can_become(self, new: JobState) -> bool:
        return new in JOB_TRANSITIONS[self]

    def check_transition(self, new: JobState) -> None:
        if not self.can_become(new):
            raise IllegalTransition("job", self.value, new.value)


_ENDINGS = {JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.STOPPED, JobState.FAILED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, JobState.RESIZING, JobState.PENDING} | _ENDINGS
    ),
    JobState.RUNNING: frozenset({JobState.RESIZING, JobState.RESTARTING, JobState.PENDING} | _ENDINGS),
    JobState.RESIZING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, JobState.RESIZING, JobState.PENDING} | _ENDINGS
    ),
    JobState.RESTARTING: frozenset(
        {JobState.RUNNING, JobState.RESIZING, JobState.RESTARTING, JobState.PENDING} | _ENDINGS
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}


# --- node -----------------------------------------------------------------------------------


class NodeState(models.TextChoices):
    """ONLINE ⇄ DRAINING → DRAINED; any → LOST (heartbeats missed) or OFFLINE (clean stop).

    A LOST or OFFLINE node that registers again becomes ONLINE. DRAINED → ONLINE is undrain.
    Only ONLINE nodes get new work.
    """

    ONLINE = "ONLINE"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    LOST = "LOST"
    OFFLINE = "OFFLINE"

    def can_become(self, new: NodeState) -> bool:
        return new in NODE_TRANSITIONS[self]

    def check_transition(self, new: NodeState) -> None:
        if not self.can_become(new):
            raise IllegalTransition("node", self.value, new.value)


NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.ONLINE: frozenset({NodeState.DRAINING, NodeState.LOST, NodeState.OFFLINE}),
    NodeState.DRAINING: frozenset({NodeState.DRAINED, NodeState.ONLINE, NodeState.LOST, NodeState.OFFLINE}),
    NodeState.DRAINED: frozenset({NodeState.ONLINE, NodeState.LOST, NodeState.OFFLINE}),
    NodeState.LOST: frozenset({NodeState.ONLINE, NodeState.OFFLINE}),
    NodeState.OFFLINE: frozenset({NodeState.ONLINE, NodeState.LOST}),
}


# --- round ----------------------------------------------------------------------------------


class RoundReason(models.TextChoices):
    """Why a round started. Only FAILURE is charged against the job's max_restarts."""

    START = "start", "start"
    RESUME = "resume", "resume"  # placed again after waiting in the queue
    RESIZE = "resize", "resize"  # the operator asked for another node count
    AUTOSCALE = "autoscale", "auto-scale"  # grown toward the desired count as capacity freed up
    PREEMPTION = "preemption", "preemption"  # shrunk to make room for a higher-priority job
    DRAIN = "drain", "drain"  # moved off a node an operator is draining
    RESTART = "restart", "restart"  # the operator restarted it on the same nodes
    FAILURE = "failure", "failure"  # a rank failed
    NODE_LOSS = "node_loss", "node loss"  # a node was lost, went offline or its agent restarted
    FALLBACK = "fallback", "in-place fallback"  # an in-place round did not form: restarted afresh

    @property
    def job_state(self) -> JobState:
        """The state a job is in while a round started for this reason comes up."""
        if self in (RoundReason.START, RoundReason.RESUME):
            return JobState.STARTING
        if self in (RoundReason.FAILURE, RoundReason.RESTART, RoundReason.FALLBACK):
            return JobState.RESTARTING
        return JobState.RESIZING

    @property
    def charged(self) -> bool:
        return self is RoundReason.FAILURE

    @property
    def breaks_previous(self) -> bool:
        """The previous round lost a member for good: its collectives are gone, and ranks blocked
        in C++ ignore SIGTERM, so it cannot checkpoint together and is killed at once."""
        return self in (RoundReason.FAILURE, RoundReason.NODE_LOSS, RoundReason.FALLBACK)

    @property
    def may_be_inplace(self) -> bool:
        """Planned changes while the job runs: its survivors can re-form in place (sdk.elastic).
        A lost node or failed rank breaks the group's collectives, so those restart afresh."""
        return self in (RoundReason.RESIZE, RoundReason.AUTOSCALE, RoundReason.PREEMPTION, RoundReason.DRAIN)


class RoundPhase(models.TextChoices):
    """Where a round is in its life. ``Round.set_state`` is the only way it moves (table below).

    STARTING → RUNNING → SETTLING → ENDED; an in-place round starts FORMING instead (→ RUNNING).

    - STARTING: made and sent to its hosts; none has reported its ranks running yet.
    - FORMING: in place: the previous round's ranks carry over and re-form at this round's
      address (console/jobs/inplace.py). RUNNING once every host reports its ranks formed
      (``Round.formed_at``); a host that cannot, a rank failure or a timeout instead end it
      (REPLACED by a fallback round).
    - RUNNING: a host reported its ranks running (or, in place, every host formed).
    - SETTLING: a rank failed (``Round.failed_at``, ``Round.failure``); the controller waits for
      every host to show it is alive before it decides what the failure costs
      (console/jobs/failures.py). Still the job's current round; its other ranks may still run.
    - ENDED: replaced, requeued, or the job ended. ``Round.outcome`` says how, set once, here.
    """

    STARTING = "starting", "starting"
    FORMING = "forming", "forming"
    RUNNING = "running", "running"
    SETTLING = "settling", "settling a failure"
    ENDED = "ended", "ended"

    @property
    def is_open(self) -> bool:
        """The job's current round (or was, until it ended): its ranks may be running."""
        return self is not RoundPhase.ENDED

    @property
    def may_carry_over(self) -> bool:
        """Its ranks run in one group (not still re-forming, not ended): an in-place round can
        carry them over."""
        return self in (RoundPhase.STARTING, RoundPhase.RUNNING, RoundPhase.SETTLING)

    def can_become(self, new: RoundPhase) -> bool:
        return new in ROUND_TRANSITIONS[self]

    def check_transition(self, new: RoundPhase) -> None:
        if not self.can_become(new):
            raise IllegalTransition("round", self.value, new.value)


ROUND_TRANSITIONS: dict[RoundPhase, frozenset[RoundPhase]] = {
    RoundPhase.STARTING: frozenset({RoundPhase.RUNNING, RoundPhase.SETTLING, RoundPhase.ENDED}),
    # A rank failure before forming is the in-place change's failure: a fallback replaces it.
    RoundPhase.FORMING: frozenset({RoundPhase.RUNNING, RoundPhase.ENDED}),
    RoundPhase.RUNNING: frozenset({RoundPhase.SETTLING, RoundPhase.ENDED}),
    # Settled: the job restarts (a new round) or fails; either way this round ends.
    RoundPhase.SETTLING: frozenset({RoundPhase.ENDED}),
    RoundPhase.ENDED: frozenset(),
}

# A round is made in one of these (in place or not); no move leads into them.
ROUND_INITIAL = frozenset({RoundPhase.STARTING, RoundPhase.FORMING})


class RoundOutcome(models.TextChoices):
    """How a round ended: set once, with its move to ENDED (none before). A round that ends
    while SETTLING a failure ends FAILED, whatever replaced it: the failure is why it ended."""

    REPLACED = "replaced", "replaced"  # a newer round took over; its reason says why
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    STOPPED = "stopped", "stopped"  # the operator stopped the job
    REQUEUED = "requeued", "requeued"  # too few nodes were left: the job went back to PENDING


# --- allocation (a node's place in a round) -------------------------------------------------


class AllocationState(models.TextChoices):
    """ASSIGNED → RUNNING (the agent reports the round up) → SUCCEEDED | FAILED | STOPPED.

    ASSIGNED may end directly (a round that ends before its first heartbeat). Final states stay.
    """

    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_live(self) -> bool:
        """Its ranks may be running."""
        return self in (AllocationState.ASSIGNED, AllocationState.RUNNING)

    def can_become(self, new: AllocationState) -> bool:
        return new in ALLOCATION_TRANSITIONS[self]

    def check_transition(self, new: AllocationState) -> None:
        if not self.can_become(new):
            raise IllegalTransition("allocation", self.value, new.value)


_ALLOCATION_ENDINGS = frozenset({AllocationState.SUCCEEDED, AllocationState.FAILED, AllocationState.STOPPED})

ALLOCATION_TRANSITIONS: dict[AllocationState, frozenset[AllocationState]] = {
    AllocationState.ASSIGNED: frozenset({AllocationState.RUNNING}) | _ALLOCATION_ENDINGS,
    AllocationState.RUNNING: _ALLOCATION_ENDINGS,
    AllocationState.SUCCEEDED: frozenset(),
    AllocationState.FAILED: frozenset(),
    AllocationState.STOPPED: frozenset(),
}
