"""Given a running job, when an operator restarts it, then every member starts a new round on the
same nodes in the same order (no stop is needed: an agent replaces a job's older round when it
starts the new one), the restart is audited, and it costs no restart; a job that is not running
cannot be restarted and nothing is sent."""

from __future__ import annotations

import pytest

from console.core.models import AuditEntry
from console.core.states import JobState
from console.jobs import actions, scheduler
from tests.support.decisions import Decide, make_job, make_node, start


def test_restart_starts_the_next_round_on_the_same_nodes_uncharged(decide: Decide) -> None:
    make_node("a"), make_node("b")
    job = make_job("again", nnodes="2")
    decide(scheduler.tick)

    restarted = decide(actions.restart_job, job.pk, None)

    assert restarted.sent() == [start(job, 2, "a", 0, 2), start(job, 2, "b", 1, 2)]
    assert restarted.kinds() == ["round.restart"]
    assert restarted.events[0].data == {"nodes": ["a", "b"], "world_size": 2, "charged": False}
    job.refresh_from_db()
    assert (job.state, job.round_number, job.restarts) == (JobState.RESTARTING, 2, 0)
    assert AuditEntry.objects.filter(action="job.restart", target_id=str(job.pk)).count() == 1


def test_a_pending_job_cannot_be_restarted(decide: Decide) -> None:
    job = make_job("waiting", nnodes="1")
    with pytest.raises(actions.ControlError, match="only a running job can be restarted"):
        decide(actions.restart_job, job.pk, None)
    assert decide.recorder.sent == []
