"""Given a lower-priority elastic job holding the nodes, when a higher-priority job is submitted
that does not fit, then the tick shrinks the lower one toward its MIN (a preemption round that
keeps node rank 0, the other nodes' ranks stopped gracefully, no restart used) and starts the
higher one on the freed nodes; a job that cannot be made room for waits, and so do later ones."""

from __future__ import annotations

from console.core.states import JobState, RoundReason
from console.jobs import scheduler
from console.jobs.models import Job
from tests.support.decisions import Decide, make_job, make_node, nodes_of, start, stop


def test_a_higher_priority_job_shrinks_a_lower_one_to_make_room(decide: Decide) -> None:
    for name in "abc":
        make_node(name, slots=1)
    low = make_job("low", nnodes="1:3")
    decide(scheduler.tick)
    Job.objects.filter(pk=low.pk).update(state=JobState.RUNNING)

    high = make_job("high", nnodes="2", priority=5)
    preempted = decide(scheduler.tick)

    assert preempted.sent() == [
        stop(low, 1, "b", 12.0),
        stop(low, 1, "c", 12.0),
        start(low, 2, "a", 0, 1),
        start(high, 1, "b", 0, 2),
        start(high, 1, "c", 1, 2),
    ]
    assert preempted.kinds() == ["job.shrunk", "round.preemption", "round.start"]
    assert preempted.events[0].message == "Shrinking to 1 node(s) to make room for higher-priority job high"
    assert [e.job_id for e in preempted.events] == [low.pk, low.pk, high.pk]
    assert nodes_of(low) == ["a"] and nodes_of(high) == ["b", "c"]
    low.refresh_from_db()
    assert low.restarts == 0 and low.current_round().reason == RoundReason.PREEMPTION  # type: ignore[union-attr]


def test_a_job_nothing_can_be_made_room_for_waits_and_so_do_the_jobs_behind_it(decide: Decide) -> None:
    make_node("a", slots=1)
    rigid = make_job("rigid", nnodes="1")
    decide(scheduler.tick)
    Job.objects.filter(pk=rigid.pk).update(state=JobState.RUNNING)
    blocked = make_job("blocked", nnodes="1", priority=5)
    behind = make_job("behind", nnodes="1", priority=5)

    waiting = decide(scheduler.tick)

    assert waiting.sent() == [] and waiting.kinds() == []
    assert nodes_of(rigid) == ["a"]
    assert Job.objects.get(pk=blocked.pk).state == Job.objects.get(pk=behind.pk).state == JobState.PENDING
