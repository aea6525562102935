"""In-place rounds in the controller (in-process, real PostgreSQL): an SDK job's resize keeps the
survivors running (the start carries them over, nothing stops), heartbeats form the round, and a
round that fails to form, loses a rank first, or is not formed in time falls back to a restart."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from console.cluster import registry
from console.cluster.models import Node
from console.core.states import JobState, RoundPhase, RoundReason
from console.jobs import actions, reports, scheduler
from console.jobs.models import Job, Round
from tests.support.decisions import Decide, failing_exit, make_job, make_node, start, stop
from tests.test_agent_restart import INFO, LOAD
from workers import protocol
from workers.protocol import InplaceStatus


def inplace_job(nnodes: str = "1:3") -> Job:
    job = make_job("sdk", nnodes=nnodes)
    Job.objects.filter(pk=job.pk).update(inplace=True)
    job.refresh_from_db()
    return job


def status(job: Job, number: int, inplace: str, reason: str = "") -> protocol.RoundStatus:
    out: protocol.RoundStatus = {
        "job_id": job.pk,
        "round": number,
        "state": protocol.RoundState.RUNNING,
        "ranks": [],
        "last_step": None,
        "first_step_at": None,
        "inplace": InplaceStatus(inplace),
    }
    if reason:
        out["inplace_reason"] = reason
    return out


def beat(decide: Decide, job: Job, number: int, node: str, inplace: str, reason: str = "") -> Any:
    return decide(
        reports.apply_round_statuses, Node.objects.get(name=node), [status(job, number, inplace, reason)]
    )


def resized_in_place(decide: Decide) -> Job:
    """A 1:3 SDK job running on a and b, resized to 3 (round 2, in place)."""
    for name in "abc":
        make_node(name)
    job = inplace_job()
    Job.objects.filter(pk=job.pk).update(desired_nodes=2, max_nodes=3)
    decide(scheduler.tick)
    return job


def test_a_resize_of_an_sdk_job_carries_the_survivors_over_and_stops_nothing(decide: Decide) -> None:
    job = resized_in_place(decide)
    grown = decide(actions.resize_job, job.pk, 3, None)
    carry = {"carry_over": {"from_round": 1, "ranks": {"0": 0, "1": 1}}}
    assert grown.sent() == [
        start(job, 2, "a", 0, 3, **carry),
        start(job, 2, "b", 1, 3, **carry),
        start(job, 2, "c", 2, 3, **carry),
    ]
    assert grown.kinds() == ["job.resize_requested", "round.resize"]
    assert "in place" in grown.events[1].message and grown.events[1].data["inplace"] is True

    # When every host reports its ranks formed, the round is formed and says how long it took
    assert Round.objects.get(job=job, number=2).state == RoundPhase.FORMING
    assert "round.formed" not in beat(decide, job, 2, "a", "formed").kinds()
    beat(decide, job, 2, "b", "forming")
    assert Round.objects.get(job=job, number=2).state == RoundPhase.FORMING
    beat(decide, job, 2, "b", "formed")
    formed = beat(decide, job, 2, "c", "formed")
    assert formed.kinds() == ["round.formed"] and formed.events[0].data["seconds"] >= 0
    rnd = Round.objects.get(job=job, number=2)
    assert rnd.state == RoundPhase.RUNNING and rnd.formed_at is not None
    assert Round.objects.get(job=job, number=1).outcome == "replaced"

    # And shrinking again stops only c, gracefully, while a and b carry over
    shrunk = decide(actions.resize_job, job.pk, 2, None)
    assert shrunk.sent() == [
        stop(job, 2, "c", 12.0),
        start(job, 3, "a", 0, 2, carry_over={"from_round": 2, "ranks": {"0": 0, "1": 1}}),
        start(job, 3, "b", 1, 2, carry_over={"from_round": 2, "ranks": {"0": 0, "1": 1}}),
    ]


def test_a_host_that_cannot_re_form_makes_the_round_restart_afresh(decide: Decide) -> None:
    job = resized_in_place(decide)
    decide(actions.resize_job, job.pk, 3, None)
    failed = beat(decide, job, 2, "c", "failed", "forming round 2 failed: DistStoreError: timeout")
    assert failed.kinds() == ["round.inplace_failed", "round.fallback"]
    assert "c: forming round 2 failed" in failed.events[0].message
    # every rank of round 2 stops at once and round 3 starts them all afresh, uncharged
    assert failed.to_agents() == [
        stop(job, 2, "a", 0.0),
        stop(job, 2, "b", 0.0),
        stop(job, 2, "c", 0.0),
        start(job, 3, "a", 0, 3),
        start(job, 3, "b", 1, 3),
        start(job, 3, "c", 2, 3),
    ]
    job.refresh_from_db()
    assert (job.restarts, job.state) == (0, JobState.RESTARTING)
    assert Round.objects.get(job=job, number=3).reason == RoundReason.FALLBACK
    never = Round.objects.get(job=job, number=2)
    assert (never.state, never.outcome, never.formed_at) == (RoundPhase.ENDED, "replaced", None)


def test_a_rank_failure_before_forming_is_a_fallback_not_a_charged_restart(decide: Decide) -> None:
    job = resized_in_place(decide)
    decide(actions.resize_job, job.pk, 3, None)
    failed = decide(reports.rank_exited, "b", job.pk, 2, failing_exit(rank=1, code=3))
    assert failed.kinds() == ["round.inplace_failed", "round.fallback"]
    assert (
        "rank 1 on b ended with exit code 3: Traceback ... ValueError: bad batch" in failed.events[0].message
    )
    job.refresh_from_db()
    assert job.restarts == 0 and job.round_number == 3


def test_a_round_not_formed_within_the_bound_falls_back(decide: Decide, settings: Any) -> None:
    settings.INPLACE_FORM_TIMEOUT = 20.0
    job = resized_in_place(decide)
    decide(actions.resize_job, job.pk, 3, None)
    beat(decide, job, 2, "a", "formed")
    assert "round.inplace_failed" not in decide(scheduler.tick).kinds()
    Round.objects.filter(job=job, number=2).update(created_at=timezone.now() - timedelta(seconds=21))
    late = decide(scheduler.tick)
    assert late.kinds()[:2] == ["round.inplace_failed", "round.fallback"]
    assert "not formed within 20 s" in late.events[0].message


def test_the_job_page_and_api_mark_in_place_rounds_and_how_long_each_change_took(
    decide: Decide, client: Any, viewer: Any
) -> None:
    job = resized_in_place(decide)
    decide(actions.resize_job, job.pk, 3, None)
    rnd = Round.objects.get(job=job, number=2)
    Round.objects.filter(pk=rnd.pk).update(formed_at=rnd.created_at + timedelta(seconds=0.75))
    client.force_login(viewer)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'title="Survivors kept their processes">in place</span>' in page
    assert "0.75 s" in page
    rounds = client.get(f"/api/v1/jobs/{job.pk}/").json()["rounds"]
    assert [(r["number"], r["inplace"], r["change_seconds"]) for r in rounds] == [
        (2, True, 0.75),
        (1, False, None),
    ]


def running_on_three(decide: Decide) -> Job:
    """A 2:3 SDK job running on a, b and c (round 1)."""
    for name in "abc":
        make_node(name)
    job = inplace_job("2:3")
    decide(scheduler.tick)
    return job


def test_a_rank_failure_carries_the_survivors_over_and_is_still_charged(
    decide: Decide, settings: Any
) -> None:
    settings.INPLACE_RECOVERY = True
    job = running_on_three(decide)
    # When rank 2 on c is SIGKILLed and every host has since shown it is alive
    decide(reports.rank_exited, "c", job.pk, 1, failing_exit(rank=2, code=None, signal="SIGKILL"))
    for name in "abc":
        registry.heartbeat(name, f"session-{name}", LOAD, [])
    recovered = decide(scheduler.tick)
    # Then round 2 keeps ranks 0 and 1 running (nothing stops) and starts only rank 2 afresh on c
    carry = {"carry_over": {"from_round": 1, "ranks": {"0": 0, "1": 1}}}
    assert recovered.sent() == [
        start(job, 2, "a", 0, 3, **carry),
        start(job, 2, "b", 1, 3, **carry),
        start(job, 2, "c", 2, 3, **carry),
    ]
    assert "in place" in recovered.events[-1].message
    job.refresh_from_db()
    assert job.restarts == 1 and Round.objects.get(job=job, number=2).reason == RoundReason.FAILURE


def test_hosts_whose_ranks_wait_in_place_are_proof_of_life_and_the_failure_settles_at_once(
    decide: Decide, settings: Any
) -> None:
    settings.INPLACE_RECOVERY = True
    job = running_on_three(decide)
    # When rank 2 on c is SIGKILLed, a and b have not heartbeated since (a tick settles nothing;
    # their agents are asked for a heartbeat now)
    failed = decide(reports.rank_exited, "c", job.pk, 1, failing_exit(rank=2, code=None, signal="SIGKILL"))
    assert failed.sent() == [(protocol.AGENT_HEARTBEAT_NOW, f"node.{name}", {}) for name in "ab"]
    assert Round.objects.get(job=job, number=1).state == RoundPhase.SETTLING
    assert not decide(scheduler.tick).sent()
    # a's ranks report they wait for the next round: not yet, b is still unheard of
    assert not beat(decide, job, 1, "a", InplaceStatus.WAITING).sent()
    # Then b's waiting report settles the failure in that same decision: round 2, in place
    settled = beat(decide, job, 1, "b", InplaceStatus.WAITING)
    carry = {"carry_over": {"from_round": 1, "ranks": {"0": 0, "1": 1}}}
    assert settled.sent() == [
        start(job, 2, "a", 0, 3, **carry),
        start(job, 2, "b", 1, 3, **carry),
        start(job, 2, "c", 2, 3, **carry),
    ]
    job.refresh_from_db()
    assert job.round_number == 2 and job.restarts == 1


def test_a_rank_failure_restarts_afresh_without_in_place_recovery(decide: Decide, settings: Any) -> None:
    settings.INPLACE_RECOVERY = False
    job = running_on_three(decide)
    decide(reports.rank_exited, "c", job.pk, 1, failing_exit(rank=2, code=None, signal="SIGKILL"))
    for name in "abc":
        registry.heartbeat(name, f"session-{name}", LOAD, [])
    restarted = decide(scheduler.tick)
    assert [stop(job, 1, name, 0.0) for name in "abc"] == restarted.to_agents()[:3]
    assert not Round.objects.get(job=job, number=2).inplace


def test_a_lost_node_leaves_and_the_others_carry_over(decide: Decide, settings: Any) -> None:
    settings.INPLACE_RECOVERY = True
    job = running_on_three(decide)
    # When b's agent comes back under a new session (its ranks are gone: a node loss)
    lost = decide(registry.register_node, "b", "session-new", INFO)
    # Then only b's old round stops and a and c carry over into a world of 2, uncharged
    carry = {"carry_over": {"from_round": 1, "ranks": {"0": 0, "2": 1}}}
    assert lost.to_agents()[:3] == [
        stop(job, 1, "b", 0.0),
        start(job, 2, "a", 0, 2, **carry),
        start(job, 2, "c", 1, 2, **carry),
    ]
    job.refresh_from_db()
    assert job.restarts == 0 and Round.objects.get(job=job, number=2).reason == RoundReason.NODE_LOSS


def test_a_heartbeat_of_the_round_being_carried_over_is_not_stopped_as_a_stray(decide: Decide) -> None:
    job = resized_in_place(decide)
    decide(actions.resize_job, job.pk, 3, None)
    # a's heartbeat still shows round 1 (the start of round 2, in place from 1, is on its way)
    old = {**status(job, 1, "pending"), "inplace": None}
    beat_old = decide(reports.apply_round_statuses, Node.objects.get(name="a"), [old])
    assert beat_old.to_agents() == []
    # while a round the job has left behind for good is still stopped
    decide(actions.resize_job, job.pk, 2, None)
    stray = decide(reports.apply_round_statuses, Node.objects.get(name="a"), [old])
    assert stray.to_agents() == [stop(job, 1, "a", 12.0)]
