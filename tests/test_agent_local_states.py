"""The agent's state machines (workers/agent/lifecycle.py: a job's slot, its round, its ranks) and
the round and rank states it reports (workers/protocol.py): exactly the moves listed here by hand
are legal; `set_state` refuses every other one (logged, the state kept). The lists are written
out, not read from the tables the code enforces, so a wrong entry there fails here. No
processes."""

from __future__ import annotations

import logging
from enum import StrEnum
from itertools import product

import pytest

from workers.agent.lifecycle import JobSlot, LocalRound, LocalState, Rank, SlotState
from workers.protocol import RankState, RoundSpec, RoundState

LEGAL = {
    ("starting", "running"),
    ("starting", "launch_failed"),
    ("starting", "stopping"),
    ("launch_failed", "killing"),
    ("launch_failed", "failed"),
    ("running", "stopping"),
    ("running", "failing"),
    ("running", "succeeded"),
    ("stopping", "killing"),
    ("stopping", "stopped"),
    ("failing", "stopping"),
    ("failing", "killing_failed"),
    ("failing", "failed"),
    ("killing", "stopped"),
    ("killing_failed", "killing"),
    ("killing_failed", "failed"),
}

REPORTED = {
    "starting": "starting",
    "launch_failed": "starting",
    "running": "running",
    "stopping": "stopping",
    "failing": "stopping",
    "killing": "stopping",
    "killing_failed": "stopping",
    "succeeded": "succeeded",
    "failed": "failed",
    "stopped": "stopped",
}


def spec() -> RoundSpec:
    return RoundSpec(  # type: ignore[typeddict-item]
        job_id=7, round=3, nproc_per_node=2, node_rank=0, grace_period=5.0, bundle=None
    )


def in_state(state: LocalState) -> LocalRound:
    local = LocalRound(spec=spec())
    local.state = state  # set up directly: the move under test is the only one made
    return local


@pytest.mark.parametrize(
    ("current", "new"),
    [
        pytest.param(a, b, id=f"{a.value}->{b.value}")
        for a, b in product(list(LocalState), repeat=2)
        if a != b
    ],
)
def test_exactly_the_listed_moves_are_legal(
    current: LocalState, new: LocalState, caplog: pytest.LogCaptureFixture
) -> None:
    local = in_state(current)
    with caplog.at_level(logging.ERROR, logger="workers.agent.lifecycle"):
        moved = local.set_state(new)
    if (current.value, new.value) in LEGAL:
        assert moved and local.state is new
        assert not caplog.records
    else:
        assert not moved and local.state is current
        assert "illegal move" in caplog.text


def test_moving_to_the_current_state_is_a_no_op() -> None:
    for state in LocalState:
        local = in_state(state)
        assert local.set_state(state) and local.state is state


def test_the_list_names_only_real_states_and_every_state_is_reported_as_listed() -> None:
    names = {state.value for state in LocalState}
    assert {name for pair in LEGAL for name in pair} <= names
    assert set(REPORTED) == names
    for state in LocalState:
        assert state.reported is RoundState(REPORTED[state.value])


def test_final_states_are_the_three_outcomes_and_a_new_round_starts_starting() -> None:
    assert {s.value for s in LocalState if s.is_final} == {"succeeded", "failed", "stopped"}
    assert LocalRound(spec=spec()).state is LocalState.STARTING


# --- the wire's round and rank states (workers/protocol.py) ----------------------------------

ROUND_LEGAL = {
    ("starting", "running"),
    ("starting", "stopping"),
    ("starting", "failed"),
    ("running", "stopping"),
    ("running", "succeeded"),
    ("stopping", "stopped"),
    ("stopping", "failed"),
}

RANK_LEGAL = {("running", "succeeded"), ("running", "failed"), ("running", "stopped")}


@pytest.mark.parametrize(
    ("enum", "legal"),
    [pytest.param(RoundState, ROUND_LEGAL, id="round"), pytest.param(RankState, RANK_LEGAL, id="rank")],
)
def test_the_reported_states_allow_exactly_the_listed_moves(
    enum: type[StrEnum], legal: set[tuple[str, str]]
) -> None:
    for current, new in product(list(enum), repeat=2):
        assert current.can_become(new) is ((current.value, new.value) in legal), (current, new)  # type: ignore[attr-defined]
    assert {s.value for s in enum if s.is_final} == {"succeeded", "failed", "stopped"}  # type: ignore[attr-defined]


def test_every_move_of_the_agents_round_is_a_legal_move_of_the_round_it_reports() -> None:
    for current, new in LEGAL:
        was, now = REPORTED[current], REPORTED[new]
        assert was == now or (was, now) in ROUND_LEGAL, (current, new, was, now)
    # and every reported move is made by some move of the agent's round
    made = {(REPORTED[a], REPORTED[b]) for a, b in LEGAL if REPORTED[a] != REPORTED[b]}
    assert made == ROUND_LEGAL


def test_a_rank_refuses_to_leave_a_final_state(caplog: pytest.LogCaptureFixture) -> None:
    rank = Rank(0, 0, files=None, handler=None)  # type: ignore[arg-type]
    rank.handler = type("H", (), {"proc": type("P", (), {"pid": 42})()})()  # type: ignore[assignment]
    assert rank.set_state(RankState.FAILED) and rank.state is RankState.FAILED
    with caplog.at_level(logging.ERROR, logger="workers.agent.lifecycle"):
        assert not rank.set_state(RankState.STOPPED)
    assert rank.state is RankState.FAILED and "illegal move failed -> stopped" in caplog.text


# --- a job on this host (JobSlot) ------------------------------------------------------------

SLOT_LEGAL = {
    ("idle", "running"),
    ("running", "idle"),
    ("running", "replacing"),
    ("running", "closing"),
    ("replacing", "running"),
    ("replacing", "closing"),
    ("closing", "idle"),
}


@pytest.mark.parametrize(
    ("current", "new"),
    [pytest.param(a, b, id=f"{a.value}->{b.value}") for a, b in product(list(SlotState), repeat=2) if a != b],
)
def test_a_job_slot_makes_exactly_the_listed_moves(
    current: SlotState, new: SlotState, caplog: pytest.LogCaptureFixture
) -> None:
    slot = JobSlot(state=current)
    with caplog.at_level(logging.ERROR, logger="workers.agent.lifecycle"):
        moved = slot.set_state(new)
    assert moved is ((current.value, new.value) in SLOT_LEGAL)
    assert slot.state is (new if moved else current)
    assert bool(caplog.records) is not moved


def round_(number: int) -> LocalRound:
    return LocalRound(spec=RoundSpec(job_id=7, round=number))  # type: ignore[typeddict-item]


def test_a_job_slot_runs_replaces_and_closes_its_rounds_keeping_active_and_pending_true_to_its_state() -> (
    None
):
    slot = JobSlot()
    first = round_(1)
    slot.run(first)
    assert (slot.state, slot.active, slot.pending) == (SlotState.RUNNING, first, None)
    # A newer round while the first stops: it waits, then is handed back to launch
    slot.replace(RoundSpec(job_id=7, round=2))  # type: ignore[typeddict-item]
    slot.replace(RoundSpec(job_id=7, round=3))  # type: ignore[typeddict-item]  # a newer one still
    assert slot.state is SlotState.REPLACING and slot.pending is not None and slot.pending["round"] == 3
    pending = slot.ended(first)
    assert pending is not None and pending["round"] == 3 and slot.last_ended is first
    third = round_(3)
    slot.run(third)
    assert (slot.state, slot.active, slot.pending) == (SlotState.RUNNING, third, None)
    # A stop cancels a pending round it covers, and the round then ends with nothing after it
    slot.replace(RoundSpec(job_id=7, round=4))  # type: ignore[typeddict-item]
    slot.cancel(3)
    assert slot.state is SlotState.REPLACING  # round 4 is newer than the stop: it stays
    slot.cancel(4)
    assert (slot.state, slot.pending) == (SlotState.RUNNING, None)
    assert slot.ended(third) is None and (slot.state, slot.active) == (SlotState.IDLE, None)
    # Closing (the agent shuts down) drops a pending round; the active one's end leaves it idle
    fifth = round_(5)
    slot.run(fifth)
    slot.replace(RoundSpec(job_id=7, round=6))  # type: ignore[typeddict-item]
    slot.close()
    assert (slot.state, slot.pending) == (SlotState.CLOSING, None)
    assert slot.ended(fifth) is None and slot.state is SlotState.IDLE
    slot.close()  # nothing runs: nothing to close
    assert slot.state is SlotState.IDLE
