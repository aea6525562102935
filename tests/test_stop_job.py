"""Given a running job, when an operator stops it, then every member's ranks get SIGTERM with the
job's grace period, the job ends STOPPED with its round closed, and a tick is asked for (its
capacity is free for the queue); stopping a finished job is refused."""

from __future__ import annotations

import pytest

from console.core.states import AllocationState, JobState
from console.jobs import actions, scheduler
from tests.support.decisions import TICK, Decide, make_job, make_node, stop


def test_stop_tells_every_member_and_ends_the_job(decide: Decide) -> None:
    make_node("a"), make_node("b")
    job = make_job("halt", nnodes="1:2")
    decide(scheduler.tick)

    stopped = decide(actions.stop_job, job.pk, None)

    assert stopped.sent() == [stop(job, 1, "a", 12.0), stop(job, 1, "b", 12.0), TICK]
    assert stopped.kinds() == ["job.stopped"]
    assert stopped.events[0].message == "Stopped by system"
    job.refresh_from_db()
    assert job.state == JobState.STOPPED and job.finished_at is not None
    rnd = job.rounds.get()
    assert (rnd.state, rnd.outcome) == ("ended", "stopped") and rnd.ended_at is not None
    assert set(rnd.allocations.values_list("state", flat=True)) == {AllocationState.STOPPED}

    with pytest.raises(actions.ControlError, match="already STOPPED"):
        decide(actions.stop_job, job.pk, None)
    assert decide.recorder.sent == []
