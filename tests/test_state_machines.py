"""The state machines (job, node, round, allocation): exactly the legal moves listed here by hand
are allowed, every other one raises. The lists are written out, not read from the tables
the code enforces, so a wrong entry in a table fails here."""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from itertools import product
from typing import Any

import pytest
from django.utils import timezone

from console.core.states import (
    ROUND_INITIAL,
    AllocationState,
    IllegalTransition,
    JobState,
    NodeState,
    RoundOutcome,
    RoundPhase,
)

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

ROUND_LEGAL = {
    ("starting", "running"),
    ("starting", "settling"),
    ("starting", "ended"),
    ("forming", "running"),
    ("forming", "ended"),
    ("running", "settling"),
    ("running", "ended"),
    ("settling", "ended"),
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
    (RoundPhase, ROUND_LEGAL),
    (AllocationState, ALLOCATION_LEGAL),
]


def every_pair() -> list[Any]:
    return [
        pytest.param(
            current,
            new,
            (current.value, new.value) in legal,
            id=f"{enum.__name__}:{current.value}->{new.value}",
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


def test_a_round_is_made_starting_or_forming_and_nothing_leads_back_there() -> None:
    assert {s.value for s in ROUND_INITIAL} == {"starting", "forming"}
    assert {s.value for s in RoundPhase if s.is_open} == {"starting", "forming", "running", "settling"}
    assert {s.value for s in RoundPhase if s.may_carry_over} == {"starting", "running", "settling"}


def test_records_refuse_illegal_moves_and_take_a_repeated_one_as_a_no_op() -> None:
    from console.jobs.models import Allocation, Round

    rnd = Round(state=RoundPhase.SETTLING)
    assert rnd.set_state(RoundPhase.SETTLING) == []  # a redelivered failure report
    with pytest.raises(IllegalTransition):
        rnd.set_state(RoundPhase.RUNNING)
    alloc = Allocation(state=AllocationState.SUCCEEDED)
    alloc.set_state(AllocationState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        alloc.set_state(AllocationState.RUNNING)


def test_a_round_stamps_each_move_and_gets_its_outcome_once_when_it_ends() -> None:
    from console.jobs.models import Round

    made = timezone.now()
    formed, failed, ended = (made + timedelta(seconds=s) for s in (1, 2, 3))
    rnd = Round(state=RoundPhase.FORMING, inplace=True, created_at=made)
    assert rnd.set_state(RoundPhase.RUNNING, at=formed) == ["state", "formed_at"]
    assert rnd.set_state(RoundPhase.SETTLING, at=failed) == ["state", "failed_at"]
    with pytest.raises(ValueError, match="outcome"):
        rnd.set_state(RoundPhase.ENDED)
    # Replaced while it settled a failure: it ended FAILED, the failure is why
    assert rnd.set_state(RoundPhase.ENDED, at=ended, outcome=RoundOutcome.REPLACED) == [
        "state",
        "outcome",
        "ended_at",
    ]
    assert (rnd.formed_at, rnd.failed_at, rnd.ended_at, rnd.outcome) == (formed, failed, ended, "failed")
    assert rnd.set_state(RoundPhase.ENDED, outcome=RoundOutcome.STOPPED) == [] and rnd.outcome == "failed"
    with pytest.raises(ValueError, match="outcome"):
        Round(state=RoundPhase.STARTING).set_state(RoundPhase.RUNNING, outcome=RoundOutcome.SUCCEEDED)
    fresh = Round(state=RoundPhase.STARTING)
    assert fresh.set_state(RoundPhase.RUNNING) == ["state"] and fresh.formed_at is None
    fresh.set_state(RoundPhase.ENDED, outcome=RoundOutcome.SUCCEEDED)
    assert fresh.outcome == "succeeded" and fresh.ended_at is not None
