"""One tick reads each job's snapshot (its view and the nodes' free capacity) once.

Before, a pending job that had to make room read its snapshot four times in one tick (the
shortfall, the shortfall again for the preemption, once more after it, and in
``change_membership``); a job that fitted read it twice. Now the scheduler's pass reads it once
and carries what a preemption frees forward (``Snapshot.after``): the count below is of the
real reads, per job, during one real tick against the database."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from console.core.states import JobState
from console.jobs import scheduler, snapshot
from console.jobs.models import Job
from console.jobs.planning import JobView, NodeView
from tests.support.decisions import Decide, make_job, make_node, nodes_of


class Reads:
    """Counts ``snapshot.node_views`` (the free capacity, for the job excluded) and
    ``snapshot.job_view`` reads, per job id, wherever they are called from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.nodes: Counter[int] = Counter()
        self.views: Counter[int] = Counter()
        real_nodes, real_view = snapshot.node_views, snapshot.job_view

        def node_views(exclude_job: Job | None = None) -> dict[int, NodeView]:
            self.nodes[exclude_job.pk if exclude_job is not None else 0] += 1
            return real_nodes(exclude_job)

        def job_view(job: Job, *args: Any) -> JobView:
            self.views[job.pk] += 1
            return real_view(job, *args)

        monkeypatch.setattr(snapshot, "node_views", node_views)
        for module in (snapshot, scheduler):
            monkeypatch.setattr(module, "job_view", job_view)

    def clear(self) -> None:
        self.nodes.clear()
        self.views.clear()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


def running(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)


def tick(decide: Decide, reads: Reads) -> Callable[[], None]:
    def run() -> None:
        reads.clear()
        decide(scheduler.tick)

    return run


def test_a_pending_job_that_fits_is_read_once(decide: Decide, reads: Reads) -> None:
    make_node("a", slots=1)
    job = make_job("fits")
    tick(decide, reads)()
    assert nodes_of(job) == ["a"]
    assert (reads.nodes[job.pk], reads.views[job.pk]) == (1, 1)


def test_a_pending_job_that_preempts_is_read_once_and_each_victim_once(decide: Decide, reads: Reads) -> None:
    for name in "abcd":
        make_node(name, slots=1)
    low = make_job("low", nnodes="1:2")
    lower = make_job("lower", nnodes="1:2", priority=-1)
    tick(decide, reads)()
    running(low)
    running(lower)
    assert nodes_of(low) == ["a", "b"] and nodes_of(lower) == ["c", "d"]

    high = make_job("high", nnodes="2", priority=5)
    tick(decide, reads)()

    # both lower-priority jobs shrank to 1 node and high runs on the two freed nodes
    assert nodes_of(lower) == ["c"] and nodes_of(low) == ["a"] and nodes_of(high) == ["b", "d"]
    assert (reads.nodes[high.pk], reads.views[high.pk]) == (1, 1)
    assert (reads.nodes[low.pk], reads.views[low.pk]) == (1, 1)
    assert (reads.nodes[lower.pk], reads.views[lower.pk]) == (1, 1)


def test_a_job_growing_into_free_nodes_is_read_once(decide: Decide, reads: Reads) -> None:
    make_node("a", slots=1)
    job = make_job("grows", nnodes="1:2")
    tick(decide, reads)()
    running(job)
    make_node("b", slots=1)
    tick(decide, reads)()
    assert nodes_of(job) == ["a", "b"]
    assert (reads.nodes[job.pk], reads.views[job.pk]) == (1, 1)
