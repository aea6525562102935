"""The job and node state machines: every legal transition works, every other one raises."""

from __future__ import annotations

import pytest

from console.core.states import JOB_TRANSITIONS, NODE_TRANSITIONS, IllegalTransition, JobState, NodeState


@pytest.mark.parametrize("current", list(JobState))
@pytest.mark.parametrize("new", list(JobState))
def test_job_transition_table_is_enforced(current: JobState, new: JobState) -> None:
    if new in JOB_TRANSITIONS[current]:
        current.check_transition(new)
    else:
        with pytest.raises(IllegalTransition):
            current.check_transition(new)


def test_terminal_job_states_go_nowhere() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED):
        assert state.is_terminal
        assert not JOB_TRANSITIONS[state]


def test_running_job_can_fall_back_to_pending_but_pending_cannot_run_directly() -> None:
    assert JobState.RUNNING.can_become(JobState.PENDING)
    assert not JobState.PENDING.can_become(JobState.RUNNING)


@pytest.mark.parametrize("current", list(NodeState))
@pytest.mark.parametrize("new", list(NodeState))
def test_node_transition_table_is_enforced(current: NodeState, new: NodeState) -> None:
    if new in NODE_TRANSITIONS[current]:
        current.check_transition(new)
    else:
        with pytest.raises(IllegalTransition):
            current.check_transition(new)


def test_only_online_nodes_take_work() -> None:
    assert [s for s in NodeState if s.schedulable] == [NodeState.ONLINE]
