"""The two state machines of the console: one enum each, legal transitions in one table."""

from __future__ import annotations

from django.db import models


class IllegalTransition(Exception):
    def __init__(self, kind: str, current: str, new: str) -> None:
        super().__init__(f"{kind} cannot go from {current} to {new}")
        self.current = current
        self.new = new


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
        return self in _TERMINAL_JOB_STATES

    @property
    def is_active(self) -> bool:
        """Has a round whose ranks may be running on some node."""
        return self in (JobState.STARTING, JobState.RUNNING, JobState.RESIZING, JobState.RESTARTING)

    def can_become(self, new: JobState) -> bool:
        return new in JOB_TRANSITIONS[self]

    def check_transition(self, new: JobState) -> None:
        if not self.can_become(new):
            raise IllegalTransition("job", self.value, new.value)


_TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
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


class NodeState(models.TextChoices):
    """ONLINE ⇄ DRAINING → DRAINED; any → LOST (heartbeats missed) or OFFLINE (clean stop).

    A LOST or OFFLINE node that registers again becomes ONLINE. DRAINED → ONLINE is undrain.
    """

    ONLINE = "ONLINE"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    LOST = "LOST"
    OFFLINE = "OFFLINE"

    @property
    def schedulable(self) -> bool:
        return self is NodeState.ONLINE

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
