"""Given a running 2-node DDP job, when one rank is SIGKILLed, then the controller restarts the
round (one restart used) from the checkpoint and the job ends SUCCEEDED; when the script
fails more often than max_restarts allows, the job is FAILED with the root cause."""

from __future__ import annotations

import os
import signal

import pytest

from console.core.states import JobState
from console.jobs.models import RoundReason
from tests.support.cluster import Cluster, assert_resumes_from_checkpoints

pytestmark = pytest.mark.cluster

STEPS = 80


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
