"""The console's state machines, one enum and one transition table each, and why rounds start.

Every record that has a life (job, node, round, allocation) moves only through ``set_state`` /
``set_outcome`` on its model, which checks the table here and raises IllegalTransition. Moving to
the state a record is already in is a no-op, not a transition (a redelivered report must not fail).
The agent's own round and rank states are workers/protocol.py's RoundState and RankState.
"""

from __future__ import annotations

from django.db import models


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: str, new: str) -> None:
        super().__init__(f"{kind} cannot go from {current or 'open'} to {new or 'open'}")
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


class RoundOutcome(models.TextChoices):
    """How a round ended: OPEN → REPLACED | SUCCEEDED | FAILED | STOPPED | REQUEUED; no way back.

    FAILED is set at the round's first rank failure, while its ranks may still run: the round
    stays the job's current one until the controller settles what the failure costs
    (``Round.awaiting_settlement``), and keeps FAILED whatever replaces it afterwards.
    """

    OPEN = "", "open"  # the job's current round (blank, as before the enum, so old rows read alike)
    REPLACED = "replaced", "replaced"  # a newer round took over; its reason says why
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    STOPPED = "stopped", "stopped"  # the operator stopped the job
    REQUEUED = "requeued", "requeued"  # too few nodes were left: the job went back to PENDING

    def can_become(self, new: RoundOutcome) -> bool:
        return new in ROUND_OUTCOME_TRANSITIONS[self]

    def check_transition(self, new: RoundOutcome) -> None:
        if not self.can_become(new):
            raise IllegalTransition("round", self.value, new.value)


ROUND_OUTCOME_TRANSITIONS: dict[RoundOutcome, frozenset[RoundOutcome]] = {
    RoundOutcome.OPEN: frozenset(
        {
            RoundOutcome.REPLACED,
            RoundOutcome.SUCCEEDED,
            RoundOutcome.FAILED,
            RoundOutcome.STOPPED,
            RoundOutcome.REQUEUED,
        }
    ),
    RoundOutcome.REPLACED: frozenset(),
    RoundOutcome.SUCCEEDED: frozenset(),
    RoundOutcome.FAILED: frozenset(),
    RoundOutcome.STOPPED: frozenset(),
    RoundOutcome.REQUEUED: frozenset(),
}


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
