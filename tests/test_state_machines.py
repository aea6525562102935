"""The state machines (job, node, round outcome, allocation): exactly the legal moves listed here
by hand are allowed, every other one raises. The lists are written out, not read from the tables
the code enforces, so a wrong entry in a table fails here."""

from __future__ import annotations

from enum import Enum
from itertools import product
from typing import Any

import pytest

from console.core.states import AllocationState, IllegalTransition, JobState, NodeState, RoundOutcome

JOB_LEGAL = {
    ("PENDING", "STARTING"),
    ("PENDING", "STOPPED"),
    ("PENDING", "FAILED"),
    ("STARTING", "RUNNING"),
    ("STARTING", "RESIZING"),
    ("STARTING", "RESTARTING"),
    ("STARTING", "PENDING"),
    ("STARTING", "SUCCEEDED"),
    ("STARTING", "FAILED"),
    ("STARTING", "STOPPED"),
    ("RUNNING", "RESIZING"),
    ("RUNNING", "RESTARTING"),
    ("RUNNING", "PENDING"),
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "STOPPED"),
    ("RESIZING", "RUNNING"),
    ("RESIZING", "RESIZING"),
    ("RESIZING", "RESTARTING"),
    ("RESIZING", "PENDING"),
    ("RESIZING", "SUCCEEDED"),
    ("RESIZING", "FAILED"),
    ("RESIZING", "STOPPED"),
    ("RESTARTING", "RUNNING"),
    ("RESTARTING", "RESIZING"),
    ("RESTARTING", "RESTARTING"),
    ("RESTARTING", "PENDING"),
    ("RESTARTING", "SUCCEEDED"),
    ("RESTARTING", "FAILED"),
    ("RESTARTING", "STOPPED"),
}

NODE_LEGAL = {
    ("ONLINE", "DRAINING"),
    ("ONLINE", "LOST"),
    ("ONLINE", "OFFLINE"),
    ("DRAINING", "DRAINED"),
    ("DRAINING", "ONLINE"),
    ("DRAINING", "LOST"),
    ("DRAINING", "OFFLINE"),
    ("DRAINED", "ONLINE"),
    ("DRAINED", "LOST"),
    ("DRAINED", "OFFLINE"),
    ("LOST", "ONLINE"),
    ("LOST", "OFFLINE"),
    ("OFFLINE", "ONLINE"),
    ("OFFLINE", "LOST"),
}

# "" is an open round (the job's current one).
ROUND_OUTCOME_LEGAL = {
    ("", "replaced"),
    ("", "succeeded"),
    ("", "failed"),
    ("", "stopped"),
    ("", "requeued"),
}

ALLOCATION_LEGAL = {
    ("ASSIGNED", "RUNNING"),
    ("ASSIGNED", "SUCCEEDED"),
    ("ASSIGNED", "FAILED"),
    ("ASSIGNED", "STOPPED"),
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "STOPPED"),
}

MACHINES: list[tuple[Any, set[tuple[str, str]]]] = [
    (JobState, JOB_LEGAL),
    (NodeState, NODE_LEGAL),
    (RoundOutcome, ROUND_OUTCOME_LEGAL),
    (AllocationState, ALLOCATION_LEGAL),
]


def every_pair() -> list[Any]:
    return [
        pytest.param(
            current,
            new,
            (current.value, new.value) in legal,
            id=f"{enum.__name__}:{current.value or 'open'}->{new.value or 'open'}",
        )
        for enum, legal in MACHINES
        for current, new in product(list(enum), repeat=2)
    ]


@pytest.mark.parametrize(("current", "new", "legal"), every_pair())
def test_exactly_the_listed_moves_are_legal(current: Enum, new: Enum, legal: bool) -> None:
    assert current.can_become(new) is legal  # type: ignore[attr-defined]
    if legal:
        current.check_transition(new)  # type: ignore[attr-defined]
    else:
        with pytest.raises(IllegalTransition):
            current.check_transition(new)  # type: ignore[attr-defined]


def test_the_lists_name_only_real_states() -> None:
    for enum, legal in MACHINES:
        values = {member.value for member in enum}
        assert {state for pair in legal for state in pair} <= values, enum.__name__


def test_terminal_job_states_are_the_three_endings() -> None:
    assert {s.value for s in JobState if s.is_terminal} == {"SUCCEEDED", "FAILED", "STOPPED"}


def test_live_allocations_are_assigned_and_running() -> None:
    assert {s.value for s in AllocationState if s.is_live} == {"ASSIGNED", "RUNNING"}


def test_records_refuse_illegal_moves_and_take_a_repeated_one_as_a_no_op() -> None:
    from console.jobs.models import Allocation, Round

    rnd = Round(outcome=RoundOutcome.FAILED)
    rnd.set_outcome(RoundOutcome.FAILED)  # a redelivered failure report
    with pytest.raises(IllegalTransition):
        rnd.set_outcome(RoundOutcome.REPLACED)
    alloc = Allocation(state=AllocationState.SUCCEEDED)
    alloc.set_state(AllocationState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        alloc.set_state(AllocationState.RUNNING)
