"""A round end whose reports were lost (a broker restart with the task unacknowledged, a
controller killed mid-task) is repaired from the host's next heartbeat, which still lists the
ended round: the job finishes or its failure is acted on, once, as the lost report would have."""

from __future__ import annotations

from console.cluster import registry
from console.core.states import AllocationState, JobState
from console.jobs import reports, scheduler
from console.jobs.models import Allocation, Job
from tests.support.decisions import Decide, failing_exit, make_job, make_node
from workers import protocol


def beat(node: str, job: Job, number: int, state: str, ranks: list[protocol.RankStatus]) -> None:
    status: protocol.RoundStatus = {
        "job_id": job.pk,
        "round": number,
        "state": protocol.RoundState(state),
        "ranks": ranks,
        "last_step": 40,
        "first_step_at": None,
    }
    registry.heartbeat(
        node, f"session-{node}", {"cpu_percent": 1.0, "memory_percent": 1.0, "gpus": []}, [status]
    )


def rank(state: str, rank: int = 0) -> protocol.RankStatus:
    return {"local_rank": 0, "rank": rank, "pid": 4242 + rank, "state": protocol.RankState(state)}


def test_a_lost_successful_end_finishes_the_job_from_the_heartbeat(decide: Decide) -> None:
    make_node("a")
    job = make_job("lost-success", nnodes="1")
    decide(scheduler.tick)

    repaired = decide(beat, "a", job, 1, "succeeded", [rank("succeeded")])
    again = decide(beat, "a", job, 1, "succeeded", [rank("succeeded")])

    assert repaired.kinds() == ["job.succeeded"]
    assert again.kinds() == [] and again.to_agents() == []
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_lost_failed_end_names_the_failed_rank_and_restarts_once(decide: Decide) -> None:
    make_node("a")
    job = make_job("lost-failure", nnodes="1")
    decide(scheduler.tick)

    repaired = decide(beat, "a", job, 1, "failed", [rank("failed")])
    again = decide(beat, "a", job, 1, "failed", [rank("failed")])

    assert repaired.kinds() == ["rank.failed", "round.failure"]
    assert again.kinds() == []
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (2, 1)
    failure = job.rounds.get(number=1).failure
    assert (failure["rank"], failure["error"]) == (0, "rank failed (its exit report was lost)")


def test_a_recorded_exit_is_the_cause_when_only_the_round_end_was_lost(decide: Decide) -> None:
    make_node("a")
    job = make_job("lost-end-only", nnodes="1", max_restarts=0)
    decide(scheduler.tick)
    alloc = Allocation.objects.get(round__job=job, round__number=1)
    # The exit report arrived (and was recorded) but the controller died before acting on it.
    alloc.exit_info = {"exits": [failing_exit(code=7)]}
    alloc.save(update_fields=["exit_info"])

    repaired = decide(beat, "a", job, 1, "failed", [rank("failed")])

    assert repaired.kinds() == ["rank.failed", "job.failed"]
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure["exit_code"] == 7


def test_a_final_state_for_an_ended_allocation_or_old_round_changes_nothing(decide: Decide) -> None:
    make_node("a")
    job = make_job("already-ended", nnodes="1")
    decide(scheduler.tick)
    decide(reports.round_ended, "a", job.pk, 1, "succeeded", [])
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert Allocation.objects.get(round__job=job).state == AllocationState.SUCCEEDED

    late = decide(beat, "a", job, 1, "failed", [rank("failed")])

    assert late.kinds() == [] and late.to_agents() == []
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
