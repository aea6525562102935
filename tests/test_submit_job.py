"""Given free nodes, when an operator submits a job, then it is stored PENDING and a tick is asked
for; the tick places it on its nodes and sends each agent its start command."""

from __future__ import annotations

from console.core.states import JobState
from console.jobs import scheduler
from tests.support.decisions import TICK, Decide, make_job, make_node, nodes_of, start


def test_submit_queues_the_job_and_the_tick_starts_it_on_every_node(decide: Decide) -> None:
    make_node("b"), make_node("a"), make_node("c")

    submitted = decide(make_job, "digits", nnodes="1:2", nproc=2)

    assert submitted.sent() == [TICK]
    assert submitted.kinds() == ["job.submitted"]
    assert submitted.events[0].message == "Job digits submitted (1:2 x 2)"
    (job,) = [e.job for e in submitted.events]
    assert job is not None and job.state == JobState.PENDING

    placed = decide(scheduler.tick)

    assert nodes_of(job) == ["a", "b"]
    assert placed.sent() == [start(job, 1, "a", 0, 2), start(job, 1, "b", 1, 2)]
    assert placed.kinds() == ["round.start"]
    assert placed.events[0].data == {"nodes": ["a", "b"], "world_size": 4, "charged": False}
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.round_number == 1
