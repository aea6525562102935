"""Hang detection, in process: the agent's decision (workers/agent/hang.py: thresholds, steps,
CPU and stack change), reading stacks (console/jobs/stackgroups.py: labels, groups, the ranks at
fault), and the controller's gathering and policy (console/jobs/hangs.py) with what it sends and
emits. The end-to-end test with real agents is tests/test_job_hang_e2e.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from console.core.states import JobState, RoundReason
from console.jobs import hangs, reports, scheduler
from console.jobs.hang_models import Hang
from console.jobs.stackgroups import culprits, group, label, rank_ranges
from tests.support.decisions import Decide, make_job, make_node
from workers import protocol
from workers.agent.hang import DEFAULT_FIRST_STEP_S, Policy, RankWatch, judge, mark_reported, threshold


# --- the agent's decision ----------------------------------------------------------------------
def test_a_stepping_rank_is_stalled_after_multiple_of_its_median_gap_with_a_floor() -> None:
    policy = Policy.of({"multiple": 10, "floor_s": 3})
    watch = RankWatch(rank=0, local_rank=0, pid=1, started_at=0.0)
    assert threshold(watch, policy) == DEFAULT_FIRST_STEP_S  # before the first step: the longer budget
    for second, step in enumerate(range(1, 12)):
        watch.note_step(step, 10.0 + 0.5 * second)
    assert threshold(watch, policy) == 5.0  # 10 x the 0.5 s median gap
    last = watch.last_progress
    assert judge([watch], policy, last + 4.9) is None
    verdict = judge([watch], policy, last + 5.1)
    assert verdict is not None and verdict.stalled == (0,) and verdict.threshold_s == 5.0
    mark_reported([watch], verdict.stalled)
    assert judge([watch], policy, last + 60) is None, "a stall is reported once"
    watch.note_step(12, last + 61)
    assert judge([watch], policy, last + 61 + 5.1) is not None, "moving again, it is watched afresh"
    assert threshold(watch, Policy.of({"multiple": 10, "floor_s": 30})) == 30.0  # the floor


def test_an_explicit_timeout_wins_and_the_same_step_again_is_no_progress() -> None:
    policy = Policy.of({"timeout_s": 2})
    watch = RankWatch(rank=3, local_rank=1, pid=1, started_at=0.0)
    assert threshold(watch, policy) == 2.0  # no first-step budget set: the timeout
    assert threshold(watch, Policy.of({"timeout_s": 2, "first_step_s": 50})) == 50.0
    watch.note_step(7, 1.0)
    watch.note_step(7, 2.5)
    assert judge([watch], policy, 3.1) is not None


def test_a_rank_without_steps_progresses_by_cpu_or_a_changing_stack_while_idle() -> None:
    policy = Policy.of({"timeout_s": 4})
    watch = RankWatch(rank=1, local_rank=0, pid=1, started_at=0.0)
    watch.note_cpu(1.0, 0.5)
    assert watch.note_cpu(1.5, 1.5)  # half a core: busy, progress (counted from the sample before)
    assert watch.last_progress == 0.5
    assert not watch.note_cpu(1.5, 2.0)  # idle
    watch.note_stack(("wait", "train.py", 10), 2.0)
    watch.note_stack(("wait", "train.py", 12), 3.0)  # it moved on while idle: progress
    assert watch.last_progress == 3.0
    watch.note_stack(("wait", "train.py", 12), 5.0)
    assert judge([watch], policy, 6.9) is None
    verdict = judge([watch], policy, 7.1)
    assert verdict is not None and verdict.stalled == (1,)


# --- reading stacks ----------------------------------------------------------------------------
def stack(
    rank: int, *frames: tuple[str, str, int], state: str = "sleeping", step: int | None = None
) -> dict[str, Any]:
    return {
        "rank": rank,
        "local_rank": 0,
        "pid": 100 + rank,
        "process_state": state,
        "step": step,
        "stalled_s": 9.0,
        "cpu_percent": 0.0,
        "threads": [
            {
                "name": "MainThread",
                "idle": True,
                "frames": [{"name": n, "file": f, "line": ln} for n, f, ln in frames],
            }
        ],
        "native": False,
        "error": "",
    }


ALLREDUCE = (("all_reduce", "torch/distributed/distributed_c10d.py", 3252), ("train", "train.py", 41))
LOADER = (
    ("get", "queue.py", 180),
    ("__next__", "torch/utils/data/dataloader.py", 733),
    ("train", "train.py", 38),
)


def test_ranks_are_grouped_by_identical_stack_and_labelled_where_the_script_is() -> None:
    stacks = [stack(0, *ALLREDUCE), stack(1, *ALLREDUCE), stack(2, *LOADER)]
    groups = group(stacks)
    assert [g.text for g in groups] == [
        "ranks 0-1 in all_reduce at train.py:41",
        "rank 2 in get at train.py:38",
    ]
    assert label(stack(5, *ALLREDUCE, state="stopped")) == "stopped in all_reduce at train.py:41"
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


def test_the_ranks_at_fault_are_behind_in_steps_else_stopped_else_outside_the_collective() -> None:
    assert culprits([stack(0, *ALLREDUCE, step=41), stack(1, *ALLREDUCE, step=40)]) == (
        [1],
        "did not reach step 41",
    )
    assert culprits([stack(0, *ALLREDUCE), stack(1, *ALLREDUCE, state="stopped")]) == ([1], "process stopped")
    assert culprits([stack(0, *ALLREDUCE), stack(1, *ALLREDUCE), stack(2, *LOADER)]) == (
        [2],
        "not in a collective its peers wait in",
    )
    assert culprits([stack(0, *ALLREDUCE), stack(1, *ALLREDUCE)], stalled=[0, 1]) == ([0, 1], "no progress")


# --- the controller ----------------------------------------------------------------------------
def report(*stacks: dict[str, Any], reason: str = "stall", stalled: list[int] | None = None) -> Any:
    return {
        "reason": reason,
        "detected_at": 1_700_000_000.0,
        "threshold_s": 4.0,
        "stalled": [s["rank"] for s in stacks] if stalled is None else stalled,
        "ranks": list(stacks),
    }


def running_job(decide: Decide, action: str = "notify", max_restarts: int = 3) -> Any:
    make_node("a"), make_node("b")
    job = make_job("stuck", nnodes="2", max_restarts=max_restarts)
    job.hang_policy = {"timeout_s": 4.0, "action": action}
    job.save(update_fields=["hang_policy"])
    decide(scheduler.tick)
    job.refresh_from_db()
    return job


def test_the_first_report_asks_the_other_hosts_and_the_last_one_emits_one_job_hang(decide: Decide) -> None:
    job = running_job(decide)
    first = decide(hangs.record_report, "b", job.pk, 1, report(stack(1, *ALLREDUCE, state="stopped")))
    assert first.sent() == [
        (
            protocol.AGENT_COLLECT_STACKS,
            "node.a",
            {"job_id": job.pk, "round": 1, "reason": "rank(s) [1] on b stalled"},
        )
    ]
    assert first.kinds() == []
    done = decide(hangs.record_report, "a", job.pk, 1, report(stack(0, *ALLREDUCE)))
    assert done.kinds() == ["job.hang"] and done.sent() == []
    event = done.events[0]
    assert (
        event.data["ranks"] == [1]
        and event.data["why"] == "process stopped"
        and event.data["action"] == "notify"
    )
    assert event.message == (
        "Round 1 stopped making progress: Rank 1: process stopped. "
        "rank 0 in all_reduce at train.py:41; rank 1 stopped in all_reduce at train.py:41"
    )
    again = decide(hangs.record_report, "a", job.pk, 1, report(stack(0, *ALLREDUCE)))
    assert again.kinds() == [], "a report after the conclusion adds to the same hang"
    assert Hang.objects.get().stacks.count() == 2
    job.refresh_from_db()
    assert job.state == JobState.RUNNING or job.state == JobState.STARTING


def test_a_hang_without_every_hosts_stacks_is_concluded_by_the_tick(decide: Decide) -> None:
    job = running_job(decide, action="fail")
    decide(hangs.record_report, "b", job.pk, 1, report(stack(1, *LOADER)))
    assert decide(hangs.conclude_gathered).kinds() == [], "still gathering"
    Hang.objects.update(detected_at=timezone.now() - timedelta(seconds=hangs.HANG_GATHER_SECONDS + 1))
    concluded = decide(hangs.conclude_gathered)
    assert concluded.kinds() == ["job.hang", "job.failed"]
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failure["ranks"] == [1]


def test_the_restart_policy_starts_a_charged_round_and_fails_past_max_restarts(decide: Decide) -> None:
    job = running_job(decide, action="restart", max_restarts=1)
    decide(hangs.record_report, "a", job.pk, 1, report(stack(0, *ALLREDUCE)))
    restarted = decide(hangs.record_report, "b", job.pk, 1, report(stack(1, *LOADER)))
    assert restarted.kinds()[0] == "job.hang" and "round.failure" in restarted.kinds()
    assert [name for name, _, _ in restarted.to_agents()].count(protocol.AGENT_START_ROUND) == 2
    job.refresh_from_db()
    assert job.round_number == 2 and job.restarts == 1
    assert job.rounds.get(number=2).reason == RoundReason.FAILURE
    assert decide(hangs.record_report, "a", job.pk, 1, report(stack(0, *ALLREDUCE))).kinds() == [], "fenced"
    decide(hangs.record_report, "a", job.pk, 2, report(stack(0, *ALLREDUCE)))
    failed = decide(hangs.record_report, "b", job.pk, 2, report(stack(1, *LOADER)))
    assert failed.kinds() == ["job.hang", "job.failed"]


def test_ranks_drifting_apart_in_heartbeats_open_a_hang(decide: Decide) -> None:
    job = running_job(decide)
    job.hang_policy = {"max_drift_steps": 50}
    job.save(update_fields=["hang_policy"])

    def status(steps: dict[str, int]) -> Any:
        return {
            "job_id": job.pk,
            "round": 1,
            "state": "running",
            "ranks": [],
            "last_step": 1,
            "first_step_at": None,
            "rank_steps": steps,
        }

    from console.cluster.models import Node

    decide(reports.apply_round_statuses, Node.objects.get(name="a"), [status({"0": 400})])
    drift = decide(reports.apply_round_statuses, Node.objects.get(name="b"), [status({"1": 300})])
    assert sorted(q for name, q, _ in drift.sent() if name == protocol.AGENT_COLLECT_STACKS) == [
        "node.a",
        "node.b",
    ]
    hang = Hang.objects.get()
    assert (hang.reason, hang.stalled) == ("drift", [1])


@pytest.mark.parametrize(
    ("hang", "error"),
    [
        ({"action": "reboot"}, "action: must be one of notify, restart, fail"),
        ({"timeout_s": 0}, "timeout_s: must be positive"),
        ({"timeout_s": "soon"}, "timeout_s: must be a number"),
        ({"every": 3}, "every: unknown field"),
        ("fast", "hang: must be an object"),
    ],
)
def test_a_bad_hang_policy_is_a_clear_400(db: None, hang: Any, error: str) -> None:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user("op", password="pw-op-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    response = api.post("/api/v1/jobs/", {"name": "j", "workload": "digits-mlp", "hang": hang}, format="json")
    assert response.status_code == 400
    assert any(error in message for message in response.json()["errors"]["hang"]), response.json()
    good = api.post(
        "/api/v1/jobs/",
        {"name": "j", "workload": "digits-mlp", "hang": {"timeout_s": 30, "action": "fail"}},
        format="json",
    )
    assert good.status_code == 201 and good.json()["hang"] == {"timeout_s": 30.0, "action": "fail"}
