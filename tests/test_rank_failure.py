"""Rank failures. In-process: the first failure of a round is recorded, charged only once every
host of the round has shown it is alive, and answered by killing the round at once everywhere
and starting the next on the same nodes; past max_restarts the job FAILS with the root cause.
End to end: a SIGKILLed rank restarts the round from the checkpoint and the job SUCCEEDS; a
script that keeps failing FAILS with its traceback; a crash in interpreter teardown after the
last step does not fail the job."""

from __future__ import annotations

import os
import signal

import pytest

from console.core.states import JobState, RoundReason
from console.jobs import reports, scheduler
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints
from tests.support.decisions import TICK, Decide, failing_exit, make_job, make_node, start, stop
from workers import protocol

STEPS = 80


def test_a_failure_is_charged_once_every_host_is_heard_from_then_the_round_is_killed_and_restarted(
    decide: Decide,
) -> None:
    # Given a 2-node job allowed one restart, running on a and b
    make_node("a"), make_node("b")
    job = make_job("flaky", nnodes="2", max_restarts=1)
    decide(scheduler.tick)

    # When rank 1 on b fails, a has not been heard from since: it may be the host that died (its
    # agent is asked for a heartbeat now)
    first = decide(reports.rank_exited, "b", job.pk, 1, failing_exit(rank=1))
    assert first.sent() == [(protocol.AGENT_HEARTBEAT_NOW, "node.a", {})]
    assert first.kinds() == ["rank.failed"]
    assert first.events[0].data["cause"] == {
        "round": 1,
        "node": "b",
        "rank": 1,
        "local_rank": 0,
        "exit_code": 3,
        "signal": None,
        "error": "Traceback ... ValueError: bad batch",
    }
    job.refresh_from_db()
    assert job.restarts == 0 and job.rounds.get().state == "settling"

    # When a's rank reports its own failure (its collective broke): a is alive, the failure is charged
    settled = decide(reports.rank_exited, "a", job.pk, 1, failing_exit(rank=0, code=None, signal="SIGABRT"))
    assert settled.sent() == [
        stop(job, 1, "a", 0.0),
        stop(job, 1, "b", 0.0),
        start(job, 2, "a", 0, 2),
        start(job, 2, "b", 1, 2),
    ]
    assert settled.kinds() == ["round.failure"]
    assert settled.events[0].data == {"nodes": ["a", "b"], "world_size": 2, "charged": True}
    job.refresh_from_db()
    assert (job.state, job.round_number, job.restarts) == (JobState.RESTARTING, 2, 1)
    assert list(job.rounds.values_list("state", "outcome")) == [("ended", "failed"), ("starting", None)]

    # When round 2 fails too, past max_restarts: the job FAILS with its root cause, ranks stopped
    decide(reports.rank_exited, "a", job.pk, 2, failing_exit(rank=0, code=7))
    failed = decide(reports.round_ended, "b", job.pk, 2, "failed", [failing_exit(rank=1, code=1)])
    assert failed.sent() == [stop(job, 2, "a", 12.0), stop(job, 2, "b", 12.0), TICK]
    assert failed.kinds() == ["job.failed"]
    assert failed.events[0].message == "Failed: rank 0 on a (exit code 7) after 1 restart(s)"
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure["exit_code"] == 7 and job.failure["node"] == "a"


def test_a_failure_with_too_few_nodes_left_sends_the_job_back_to_the_queue_charged(decide: Decide) -> None:
    from console.cluster.actions import drain_node

    make_node("a")
    b = make_node("b")
    job = make_job("strict", nnodes="2")
    decide(scheduler.tick)
    drain_node(b.pk, None)  # b takes no new work

    decide(reports.rank_exited, "a", job.pk, 1, failing_exit())
    requeued = decide(reports.rank_exited, "b", job.pk, 1, failing_exit(rank=1))

    assert requeued.to_agents() == [stop(job, 1, "a", 12.0), stop(job, 1, "b", 12.0)]
    assert requeued.kinds() == ["job.pending"]
    assert requeued.events[0].message == "Rank failure and only 1 node(s) available; waiting for capacity"
    job.refresh_from_db()
    assert (job.state, job.restarts) == (JobState.PENDING, 1)
    assert (job.rounds.get().state, job.rounds.get().outcome) == ("ended", "failed")


@pytest.mark.cluster
def test_sigkill_of_one_rank_restarts_the_round_from_the_checkpoint(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b")
    job = cluster.submit_ddp(nnodes="2", steps=STEPS)
    cluster.wait_steps(job, world=2, count=12)
    victims = cluster.rank_pids("node-b")
    assert victims, "no rank process found on node-b"
    os.kill(victims[0], signal.SIGKILL)

    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 1
    failure_round = job.rounds.get(number=2)
    assert failure_round.reason == RoundReason.FAILURE and failure_round.charged
    assert_resumes_from_checkpoints(cluster.progress(job), every=5, total=STEPS)
    failed = job.events.get(kind="rank.failed")
    assert failed.data["cause"]["signal"] == "SIGKILL" and failed.data["cause"]["node"] == "node-b"


@pytest.mark.cluster
def test_failures_beyond_max_restarts_fail_the_job_with_the_root_cause(cluster: Cluster) -> None:
    cluster.start_agents("node-a")
    job = cluster.submit_ddp(
        nnodes="1", steps=STEPS, max_restarts=0, extra_args=["--fail-at-step", "4", "--fail-rank", "0"]
    )
    job = cluster.wait_state(job, JobState.FAILED, JobState.SUCCEEDED, timeout=90)
    assert job.state == JobState.FAILED, cluster.diagnose(job)
    assert job.failure["rank"] == 0 and job.failure["node"] == "node-a" and job.failure["exit_code"] == 1
    assert "injected failure at step 4 on rank 0" in job.failure["error"]
    assert job.restarts == 0 and job.round_number == 1


@pytest.mark.cluster
def test_a_rank_that_dies_in_interpreter_teardown_after_its_last_step_does_not_fail_the_job(
    cluster: Cluster,
) -> None:
    # Given a 1-node job allowed no restart, whose rank SIGABRTs itself in the interpreter's
    # teardown after its script ended (what torch 2.13's gloo does now and then)
    cluster.start_agents("node-a")
    job = cluster.submit_ddp(nnodes="1", steps=20, max_restarts=0, extra_args=["--abort-in-teardown"])

    # Then the job succeeds in its first round, and operators are told what the teardown did
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=90)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.restarts == 0 and job.round_number == 1
    event = job.events.get(kind="rank.teardown")
    assert event.data == {"rank": 0, "exit_code": 0, "teardown": "SIGABRT"}
    assert event.severity == "warning"
    (exit_,) = job.rounds.get(number=1).allocations.get().exit_info["exits"]
    assert (exit_["exit_code"], exit_["signal"], exit_["teardown"]) == (0, None, "SIGABRT")
