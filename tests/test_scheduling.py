"""Placement in the database: gang scheduling, priorities and FIFO, GPUs, nodes that take no work,
node ranks across resizes. In-process against the real PostgreSQL, no agent or controller process.
Preemption, drains, node loss, failures and restarts have their own files (tests/test_*.py),
which also check the commands sent."""

from __future__ import annotations

import pytest

from console.core.states import JobState, NodeState
from console.jobs import actions, scheduler
from console.jobs.models import Allocation, Job, RoundReason
from tests.support.decisions import make_job, make_node, nodes_of

pytestmark = pytest.mark.django_db


def test_gang_job_waits_until_min_nodes_are_free() -> None:
    make_node("a")
    job = make_job("gang", nnodes="2:3")
    scheduler.schedule()
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    make_node("b")
    scheduler.schedule()
    assert nodes_of(job) == ["a", "b"]
    assert job.state == JobState.STARTING
    rnd = job.current_round()
    assert rnd is not None and rnd.world_size == 2 and rnd.reason == RoundReason.START


def test_elastic_job_takes_up_to_max_nodes() -> None:
    for name in "abcd":
        make_node(name)
    job = make_job("elastic", nnodes="1:3")
    scheduler.schedule()
    assert nodes_of(job) == ["a", "b", "c"]


def test_higher_priority_first_and_fifo_within_a_priority() -> None:
    make_node("a", slots=1)
    first = make_job("first", nnodes="1")
    second = make_job("second", nnodes="1")
    urgent = make_job("urgent", nnodes="1", priority=10)
    scheduler.schedule()
    assert nodes_of(urgent) == ["a"]
    assert Job.objects.get(pk=first.pk).state == JobState.PENDING
    assert Job.objects.get(pk=second.pk).state == JobState.PENDING
    actions.stop_job(urgent.pk, None)
    scheduler.schedule()
    assert nodes_of(first) == ["a"]
    assert Job.objects.get(pk=second.pk).state == JobState.PENDING


def test_a_gpu_is_never_given_to_two_ranks() -> None:
    make_node("g", slots=8, gpus=4)
    one = make_job("one", nproc=2, gpus_per_proc=1)
    two = make_job("two", nproc=2, gpus_per_proc=1)
    three = make_job("three", nproc=1, gpus_per_proc=1)
    scheduler.schedule()
    given = [
        a.gpu_indices for a in Allocation.objects.filter(round__job__in=[one, two]).order_by("round__job")
    ]
    assert sorted(given[0] + given[1]) == [0, 1, 2, 3]
    assert Job.objects.get(pk=three.pk).state == JobState.PENDING


def test_nodes_that_are_not_online_get_no_work() -> None:
    for name, state in (
        ("d", NodeState.DRAINING),
        ("l", NodeState.LOST),
        ("o", NodeState.OFFLINE),
        ("x", NodeState.DRAINED),
    ):
        make_node(name, state=state)
    job = make_job("nowhere")
    scheduler.schedule()
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    make_node("ok")
    scheduler.schedule()
    assert nodes_of(job) == ["ok"]


def test_resize_keeps_node_ranks_of_the_nodes_that_stay() -> None:
    for name in "abc":
        make_node(name)
    job = make_job("resize", nnodes="1:3")
    actions.resize_job(job.pk, 2, None)
    scheduler.schedule()
    assert nodes_of(job) == ["a", "b"]
    actions.resize_job(job.pk, 3, None)
    assert nodes_of(job) == ["a", "b", "c"]
    actions.resize_job(job.pk, 1, None)
    assert nodes_of(job) == ["a"]
    job.refresh_from_db()
    assert job.round_number == 3 and job.restarts == 0
    assert [r.reason for r in job.rounds.order_by("number")] == ["start", "resize", "resize"]


def test_every_state_change_emits_an_event() -> None:
    from console.telemetry.models import Event

    make_node("a")
    job = make_job("events", nnodes="1")
    scheduler.schedule()
    actions.stop_job(job.pk, None)
    kinds = list(Event.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds == ["job.submitted", "round.start", "job.stopped"]
