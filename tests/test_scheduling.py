"""Placement decisions in the database: gang scheduling, priorities, GPUs, draining nodes.

These call the controller's functions in-process against the real PostgreSQL; commands to
agents are sent only after commit, which the test transaction never does.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core.states import JobState, NodeState
from console.jobs import actions, reports, scheduler
from console.jobs.models import Allocation, Job, RoundReason
from workers.protocol import RankExit

pytestmark = pytest.mark.django_db


def make_node(name: str, slots: int = 2, gpus: int = 0, state: NodeState = NodeState.ONLINE) -> Node:
    node = Node.objects.create(
        name=name, address="127.0.0.1", slots=slots, cpus=slots, state=state, last_heartbeat=timezone.now()
    )
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, name="NVIDIA A100", memory_bytes=80 << 30)
    return node


def make_job(name: str, nnodes: str = "1", nproc: int = 1, gpus_per_proc: int = 0, priority: int = 0) -> Job:
    low, _, high = nnodes.partition(":")
    high = high or low
    job = Job(
        name=name,
        entrypoint="/bin/true",
        min_nodes=int(low),
        max_nodes=int(high),
        desired_nodes=int(high),
        nproc_per_node=nproc,
        gpus_per_proc=gpus_per_proc,
        priority=priority,
    )
    return actions.submit_job(job, None)


def nodes_of(job: Job) -> list[str]:
    job.refresh_from_db()
    rnd = job.current_round()
    if rnd is None or not job.job_state.is_active:
        return []
    return [a.node.name for a in rnd.allocations.order_by("node_rank")]


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


def test_lower_priority_elastic_job_shrinks_to_make_room() -> None:
    for name in "abc":
        make_node(name, slots=1)
    low = make_job("low", nnodes="1:3")
    scheduler.schedule()
    assert nodes_of(low) == ["a", "b", "c"]
    Job.objects.filter(pk=low.pk).update(state=JobState.RUNNING)
    high = make_job("high", nnodes="2", priority=5)
    scheduler.schedule()
    assert nodes_of(low) == ["a"]
    assert nodes_of(high) == ["b", "c"]
    low.refresh_from_db()
    assert low.restarts == 0  # a membership change, not a failure


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


def test_rank_failures_use_up_restarts_then_fail_with_the_root_cause() -> None:
    make_node("a")
    job = make_job("flaky", nnodes="1")
    Job.objects.filter(pk=job.pk).update(max_restarts=1)
    scheduler.schedule()
    exit_info: RankExit = {
        "local_rank": 0,
        "rank": 0,
        "pid": 1,
        "exit_code": 3,
        "signal": None,
        "error": "boom",
        "at": 0.0,
    }
    reports.rank_exited("a", job.pk, 1, exit_info)
    job.refresh_from_db()
    assert (job.state, job.round_number, job.restarts) == (JobState.RESTARTING, 2, 1)
    reports.rank_exited("a", job.pk, 1, exit_info)  # a late report for the old round is fenced
    job.refresh_from_db()
    assert job.round_number == 2
    reports.rank_exited("a", job.pk, 2, {**exit_info, "error": "Traceback ... ValueError: bad batch"})
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.failure["rank"] == 0 and job.failure["exit_code"] == 3
    assert "ValueError: bad batch" in job.failure["error"]


def test_lost_node_gives_a_smaller_round_or_sends_the_job_back_to_pending() -> None:
    a, b = make_node("a"), make_node("b")
    elastic = make_job("elastic", nnodes="1:2")
    scheduler.schedule()
    assert nodes_of(elastic) == ["a", "b"]
    Node.objects.filter(pk=b.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    scheduler.tick()
    assert Node.objects.get(pk=b.pk).state == NodeState.LOST
    assert nodes_of(elastic) == ["a"]
    elastic.refresh_from_db()
    assert elastic.restarts == 0 and elastic.current_round().reason == RoundReason.NODE_LOSS  # type: ignore[union-attr]
    Node.objects.filter(pk=a.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    Job.objects.filter(pk=elastic.pk).update(progress={"step": 42})
    scheduler.tick()
    elastic.refresh_from_db()
    assert elastic.state == JobState.PENDING and elastic.progress == {"step": 42}


def test_draining_a_node_moves_elastic_jobs_off_it_then_it_is_drained() -> None:
    from console.cluster.actions import drain_node

    a, b = make_node("a"), make_node("b")
    job = make_job("elastic", nnodes="1:2")
    scheduler.schedule()
    assert nodes_of(job) == ["a", "b"]
    drain_node(b.pk, None)
    scheduler.tick()
    assert nodes_of(job) == ["a"]
    assert Node.objects.get(pk=b.pk).state == NodeState.DRAINED
    assert Node.objects.get(pk=a.pk).state == NodeState.ONLINE
    job.refresh_from_db()
    assert job.restarts == 0


def test_operator_restart_is_a_new_round_on_the_same_nodes_and_costs_no_restart() -> None:
    from console.core.models import AuditEntry

    make_node("a")
    job = make_job("again", nnodes="1")
    scheduler.schedule()
    actions.restart_job(job.pk, None)
    job.refresh_from_db()
    rnd = job.current_round()
    assert rnd is not None and rnd.number == 2 and rnd.reason == RoundReason.RESTART and not rnd.charged
    assert nodes_of(job) == ["a"] and job.restarts == 0 and job.state == JobState.RESTARTING
    assert AuditEntry.objects.filter(action="job.restart", target_id=str(job.pk)).exists()


def test_every_state_change_emits_an_event() -> None:
    from console.telemetry.models import Event

    make_node("a")
    job = make_job("events", nnodes="1")
    scheduler.schedule()
    actions.stop_job(job.pk, None)
    kinds = list(Event.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds == ["job.submitted", "round.start", "job.stopped"]
