"""A hung rank end to end, with real agents and gloo ranks: a plain DDP script's rank on one host
is frozen with SIGSTOP; both agents see their ranks stop making progress (no steps reported: CPU
idle, stacks unchanged), read every rank's stacks with py-spy, and the controller emits one
``job.hang`` naming the frozen rank, with both ranks' stacks kept; the job's ``restart`` policy
then brings it back (a new round, resumed from the checkpoint) and it succeeds."""

from __future__ import annotations

import os
import signal
import time

import pytest

from console.core.states import JobState, RoundReason
from console.jobs.hang_models import Hang
from console.telemetry.models import Event
from tests.support.cluster import Cluster
from tests.support.controller import wait_for

STEPS = 160
TIMEOUT_S = 4.0


# The script reports no steps, so its 4 s threshold judges the restarted round's start-up too (a
# rank waiting for its peers is idle): beside another worker's load that start-up can take longer.
@pytest.mark.alone
@pytest.mark.cluster
def test_a_sigstopped_rank_raises_job_hang_naming_it_with_stacks_and_restart_brings_the_job_back(
    cluster: Cluster,
) -> None:
    cluster.start_agents("node-a", "node-b")
    job = cluster.submit_ddp(
        nnodes="2", steps=STEPS, step_sleep=0.05, hang={"timeout_s": TIMEOUT_S, "action": "restart"}
    )
    cluster.wait_steps(job, world=2, count=15)
    frozen = cluster.rank_pids("node-b")
    assert frozen, "no rank process found on node-b"
    os.kill(frozen[0], signal.SIGSTOP)
    stopped_at = time.time()
    try:
        event = wait_for(
            lambda: Event.objects.filter(job=job, kind="job.hang").first(),
            timeout=60,
            message="a job.hang event",
        )
    except AssertionError:
        os.kill(frozen[0], signal.SIGCONT)
        raise AssertionError(cluster.diagnose(job)) from None
    emitted = time.time()

    # Then it names the frozen rank (global rank 1, on node-b), why, and the ranks' groups
    assert event.data["ranks"] == [1], event.message
    assert event.data["why"] == "process stopped"
    assert event.data["action"] == "restart" and event.severity == "warning"
    assert emitted - stopped_at < TIMEOUT_S + 15, "the hang was seen far past its threshold"
    hang = Hang.objects.get(pk=event.data["hang"])
    stacks = {s.rank: s for s in hang.stacks.all()}
    assert set(stacks) == {0, 1}, "every rank's stack is kept with the job"
    assert stacks[1].node_name == "node-b" and stacks[1].process_state == "stopped"
    for stack in stacks.values():
        assert stack.threads and stack.threads[0]["frames"], stack.error
        files = {frame["file"] for frame in stack.threads[0]["frames"]}
        assert "ddp_train.py" in files, files
    # rank 0 waits for the frozen rank in a collective (the stop-flag all-reduce, or backward's)
    assert "stopped" in event.message and "rank 0 in" in event.message.lower(), event.message

    # And the restart policy brings the job back: a new round (charged), resumed, succeeded
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.rounds.get(number=2).reason == RoundReason.FAILURE
    assert job.restarts == 1
    api = cluster.api.get(f"/api/v1/jobs/{job.pk}/hangs/").json()["results"]
    assert [h["ranks"] for h in api] == [[1]]
    assert sorted(r for g in api[0]["groups"] for r in g["ranks"]) == [0, 1]
