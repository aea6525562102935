"""The agent's round on a host (workers/agent/lifecycle.py): exactly the moves listed here by hand
are legal; `LocalRound.set_state` refuses every other one (logged, the state kept). The list is
written out, not read from the table the code enforces, so a wrong entry there fails here. No
processes."""

from __future__ import annotations

import logging
from itertools import product

import pytest

from workers.agent.lifecycle import LocalRound, LocalState
from workers.protocol import RoundSpec, RoundState

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
