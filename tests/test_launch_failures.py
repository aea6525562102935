"""Configuration errors are not crashes. A round whose ranks never started (the agent could not
fetch the bundle, find the entrypoint or the interpreter) or never reached their peers (before
the first step) is a launch failure: an event naming the host and the cause at once, the job
page's banner, no restart charged; LAUNCH_FAILURE_LIMIT of them in a row fail the job. Repeated
failures of rounds that never got going back off (CrashLoopBackOff); a first failure, or one
after the round took a step, restarts at once. In-process decisions on the real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone as dj_timezone

from console.core.states import JobState, RoundReason
from console.jobs import backoff, failures, reports, scheduler
from console.jobs.backoff import PastRound
from console.jobs.models import Job, Round
from tests.support.decisions import Decide, failing_exit, make_job, make_node
from workers import protocol

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def launch_exit(rank: int, message: str) -> protocol.RankExit:
    exit: protocol.RankExit = failing_exit(rank=rank, code=None)
    exit["pid"], exit["error"], exit["launch"] = 0, f"launch failed: {message}", True
    return exit


def past(reason: str, *, lived: float, stepped: bool = False, launch: bool = False) -> PastRound:
    return PastRound(reason, T0, stepped, T0 + timedelta(seconds=lived), launch)


# --- the pure decisions -----------------------------------------------------------------------
def test_what_counts_as_a_launch_failure() -> None:
    assert backoff.launch_kind({"launch": True, "error": "x"}, round_stepped=True) == "launch"
    gloo = "RuntimeError: Gloo connectFullMesh failed with ... remote=[127.0.0.1]:4242"
    store = "torch.distributed.DistNetworkError: failed to connect to 10.9.0.2:29500 (Connection refused)"
    assert backoff.launch_kind({"error": gloo}, round_stepped=False) == "network"
    assert backoff.launch_kind({"error": store}, round_stepped=False) == "network"
    # The same error once the round has taken a step is a peer that died mid-training.
    assert backoff.launch_kind({"error": gloo}, round_stepped=True) == ""
    assert backoff.launch_kind({"error": "ValueError: bad batch"}, round_stepped=False) == ""


def test_false_starts_count_back_to_a_round_that_got_going_or_a_fresh_start() -> None:
    failure, resize = RoundReason.FAILURE.value, RoundReason.RESIZE.value
    assert backoff.false_starts([past(failure, lived=3)], 60, failure) == 1
    chain = [past(failure, lived=3), past(failure, lived=2), past(resize, lived=1)]
    assert backoff.false_starts(chain, 60, failure) == 3  # the resize's round failed too; it ends the run
    assert (
        backoff.false_starts([past(failure, lived=3), past(failure, lived=9, stepped=True)], 60, failure) == 1
    )
    assert backoff.false_starts([past(failure, lived=3), past(failure, lived=600)], 60, failure) == 1
    assert backoff.false_starts([past(failure, lived=3, stepped=True)], 60, failure) == 0
    running = PastRound(failure, T0, False, None)
    assert backoff.false_starts([running], 60, failure) == 0


def test_the_delay_is_none_first_then_doubles_up_to_the_cap() -> None:
    assert [backoff.restart_delay(n, 2.0, 20.0) for n in range(7)] == [0, 0, 2, 4, 8, 16, 20]
    assert backoff.restart_delay(5, 0.0, 20.0) == 0.0


def test_launch_failures_in_a_row() -> None:
    failure = RoundReason.FAILURE.value
    rounds = [
        past(failure, lived=1, launch=True),
        past(failure, lived=1, launch=True),
        past(failure, lived=1),
    ]
    assert backoff.launch_failures_in_a_row(rounds, failure) == 2


# --- the controller ---------------------------------------------------------------------------
def age_failure(job: Job, seconds: float) -> None:
    """The current round failed ``seconds`` earlier than recorded (the back-off has run out)."""
    rnd = job.rounds.get(number=job.round_number)
    assert rnd.failed_at is not None
    Round.objects.filter(pk=rnd.pk).update(failed_at=rnd.failed_at - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_a_launch_failure_names_the_host_costs_no_restart_backs_off_and_fails_at_the_limit(
    decide: Decide, settings: object, admin_user: User
) -> None:
    settings.LAUNCH_FAILURE_LIMIT = 3  # type: ignore[attr-defined]
    make_node("a")
    job = make_job("typo", nnodes="1", max_restarts=1)
    decide(scheduler.tick)

    # When the agent cannot find the entrypoint
    missing = "entrypoint 'trian.py' not found in /srv/code"
    first = decide(reports.round_ended, "a", job.pk, 1, "failed", [launch_exit(0, missing)])

    # Then the event names the host and the cause, and the round restarts at once, uncharged
    assert first.kinds()[0] == "round.launch_failed"
    assert first.events[0].message == f"Round 1 could not start on a: {missing}"
    assert first.events[0].node is not None and first.events[0].node.name == "a"
    job.refresh_from_db()
    assert (job.state, job.round_number, job.restarts) == (JobState.RESTARTING, 2, 0)
    assert job.rounds.get(number=2).charged is False

    # And the job page says so while the job lives
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Could not start on a (round 1)" in page and missing.replace("'", "&#x27;") in page

    # When it fails again before getting going: it waits, saying for how long
    second = decide(reports.round_ended, "a", job.pk, 2, "failed", [launch_exit(0, missing)])
    assert second.kinds() == ["round.launch_failed", "job.backoff"]
    assert "restarting in 2 s" in second.events[1].message
    job.refresh_from_db()
    assert job.round_number == 2
    assert decide(failures.settle_failed_rounds).to_agents() == []  # still waiting

    # Once the delay has passed, the tick restarts it, still uncharged
    age_failure(job, 2.5)
    decide(failures.settle_failed_rounds)
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (3, 0)

    # At the limit of launch failures in a row, the job fails with the cause, without waiting
    ended = decide(reports.round_ended, "a", job.pk, 3, "failed", [launch_exit(0, missing)])
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert ended.kinds()[-1] == "job.failed"
    assert ended.events[-1].message == (
        f"Failed: round 3 could not start on a ({missing}); 3 launch failures in a row"
    )
    assert job.failure["launch"] == "launch" and job.failure["node"] == "a"


@pytest.mark.django_db
def test_a_rank_failure_after_the_round_got_going_restarts_at_once_and_a_crash_loop_backs_off(
    decide: Decide,
) -> None:
    make_node("a")
    job = make_job("crashy", nnodes="1", max_restarts=5)
    decide(scheduler.tick)

    # Round 1 fails before a step: the first failure restarts at once (charged)
    decide(reports.rank_exited, "a", job.pk, 1, failing_exit(rank=0))
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (2, 1)

    # Round 2 took steps, then a rank was killed: at once again
    Round.objects.filter(job=job, number=2).update(first_step_at=dj_timezone.now())
    decide(reports.rank_exited, "a", job.pk, 2, failing_exit(rank=0, code=None, signal="SIGKILL"))
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (3, 2)

    # Round 3 crashes before a step (a crash after a healthy round is a first): at once
    decide(reports.rank_exited, "a", job.pk, 3, failing_exit(rank=0))
    job.refresh_from_db()
    assert job.round_number == 4

    # Round 4 too: the second false start in a row waits
    waited = decide(reports.rank_exited, "a", job.pk, 4, failing_exit(rank=0))
    assert waited.kinds() == ["rank.failed", "job.backoff"]
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (4, 3)


@pytest.mark.django_db
def test_a_rank_that_cannot_reach_its_peers_before_the_first_step_is_a_launch_failure(decide: Decide) -> None:
    make_node("a"), make_node("b")
    job = make_job("split", nnodes="2", max_restarts=0)
    decide(scheduler.tick)
    cut = failing_exit(rank=1)
    cut["error"] = (
        "Traceback ...\nRuntimeError: Gloo connectFullMesh failed with ... remote=[127.0.0.1]:41231"
    )

    done = decide(reports.rank_exited, "b", job.pk, 1, cut)
    assert done.kinds()[0] == "round.launch_failed"
    assert "could not start on b: RuntimeError: Gloo connectFullMesh failed" in done.events[0].message
    # a reports too (its collective broke): settled, and with max_restarts 0 the job still restarts
    decide(reports.rank_exited, "a", job.pk, 1, failing_exit(rank=0, code=1))
    job.refresh_from_db()
    assert (job.state, job.round_number, job.restarts) == (JobState.RESTARTING, 2, 0)
