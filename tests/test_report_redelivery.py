"""Agents' reports delivered twice (a redelivered Celery task after a controller crash, or an
agent that sent again) change nothing the second time: the exit is recorded once, the failure
acted on once, the job finished once, a node registered or taken offline once."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from console.cluster import tasks as cluster_tasks
from console.cluster.models import Node
from console.core.states import JobState, NodeState
from console.jobs import scheduler
from console.jobs import tasks as job_tasks
from console.jobs.models import Allocation
from tests.support.decisions import Decide, failing_exit, make_job, make_node
from tests.support.reports import deliver, sealed
from workers import protocol


def report(task: Any, **kwargs: Any) -> None:
    """Deliver ``task`` as the controller's worker does (eagerly here), with the node token."""
    result = deliver(task, settings.NODE_TOKEN, **kwargs)
    assert result.successful()


def test_a_redelivered_rank_exit_is_recorded_and_acted_on_once(decide: Decide) -> None:
    make_node("a")
    job = make_job("once", nnodes="1")
    decide(scheduler.tick)
    kwargs = {"node": "a", "job_id": job.pk, "round": 1, "exit": failing_exit()}

    first = decide(report, job_tasks.rank_exited, **kwargs)
    again = decide(report, job_tasks.rank_exited, **kwargs)

    assert first.kinds() == ["rank.failed", "round.failure"] and len(first.to_agents()) == 2
    assert again.sent() == [] and again.kinds() == []
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (2, 1)
    assert Allocation.objects.get(round__job=job, round__number=1).exit_info["exits"] == [failing_exit()]


def test_a_later_exit_of_the_same_rank_is_a_new_exit(decide: Decide) -> None:
    make_node("a")
    job = make_job("twice", nnodes="1")
    decide(scheduler.tick)
    clean = {**failing_exit(), "exit_code": 0, "error": ""}
    report(job_tasks.rank_exited, node="a", job_id=job.pk, round=1, exit=clean)
    report(job_tasks.rank_exited, node="a", job_id=job.pk, round=1, exit={**clean, "pid": 4343})
    assert len(Allocation.objects.get(round__job=job).exit_info["exits"]) == 2


def test_a_redelivered_round_end_finishes_the_job_once(decide: Decide) -> None:
    make_node("a")
    job = make_job("done", nnodes="1")
    decide(scheduler.tick)
    kwargs = {"node": "a", "job_id": job.pk, "round": 1, "outcome": "succeeded", "failures": []}

    first = decide(report, job_tasks.round_ended, **kwargs)
    again = decide(report, job_tasks.round_ended, **kwargs)

    assert first.kinds() == ["job.succeeded"]
    assert again.kinds() == [] and again.sent() == []
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_redelivered_failed_round_end_is_one_failure(decide: Decide) -> None:
    make_node("a")
    job = make_job("broken", nnodes="1", max_restarts=0)
    decide(scheduler.tick)
    kwargs = {"node": "a", "job_id": job.pk, "round": 1, "outcome": "failed", "failures": [failing_exit()]}

    first = decide(report, job_tasks.round_ended, **kwargs)
    again = decide(report, job_tasks.round_ended, **kwargs)

    assert first.kinds() == ["rank.failed", "job.failed"]
    assert again.kinds() == [] and again.sent() == []


def test_redelivered_registration_and_offline_reports_change_nothing_twice(decide: Decide) -> None:
    info: protocol.NodeInfo = {
        "hostname": "h",
        "address": "10.0.0.7",
        "cpus": 4,
        "memory_bytes": 1 << 30,
        "slots": 4,
        "gpus": [{"index": 0, "name": "NVIDIA A100", "uuid": "GPU-1", "memory_bytes": 1 << 34}],
        "torch_version": "2.13.0",
        "agent_version": "0.2.0",
        "protocol": protocol.PROTOCOL_VERSION,
    }
    registered = decide(report, cluster_tasks.register, node="n", session="s", info=info)
    again = decide(report, cluster_tasks.register, node="n", session="s", info=info)
    assert registered.kinds() == ["node.registered"] and again.kinds() == []
    node = Node.objects.get(name="n")
    assert node.gpus.count() == 1 and node.state == NodeState.ONLINE

    offline = decide(report, cluster_tasks.node_offline, node="n", session="s")
    offline_again = decide(report, cluster_tasks.node_offline, node="n", session="s")
    assert offline.kinds() == ["node.offline"] and offline_again.kinds() == []


def test_a_report_with_a_bad_token_is_dropped(decide: Decide) -> None:
    make_node("a")
    job = make_job("guarded", nnodes="1")
    decide(scheduler.tick)
    result = job_tasks.rank_exited.apply(
        kwargs=sealed(
            "wrong", job_tasks.rank_exited.name, node="a", job_id=job.pk, round=1, exit=failing_exit()
        )
    )
    assert result.successful()
    assert Allocation.objects.get(round__job=job).exit_info == {}
