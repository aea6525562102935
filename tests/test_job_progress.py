"""How far a job is, for every kind of job (console/jobs/progress.py), as the job page, the jobs
list, the dashboard, the API and the CLI show it.

First the rule in-process (no database): a round's count only goes up, a restart round starts its
own, an in-place round goes on; a parameter-server job counts the coordinator's examples (or
shards). Then the controller's side against the real PostgreSQL: heartbeats of a plain script, an
SDK script, a built-in workload, an in-place job and a parameter-server job (whose processes'
own counters, 4,220,928 worker pushes, are not its progress), and the settling pass that reads a
finished job's last telemetry after it ended. Then the pages' labels.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from console.cluster.models import Node
from console.core.decision import decision
from console.core.states import JobState, RoundReason
from console.jobs import actions, progress, reports, scheduler
from console.jobs.models import Job, Round
from console.jobs.progress import EXAMPLES, SHARDS, STEPS, Progress, combine, from_queue, label
from console.jobs.rounds import finish_job
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from tests.support.decisions import Decide, make_job, make_node
from workers import protocol
from workers.cli.output import progress_text

# --- the rule, in-process ---------------------------------------------------------------------


def test_within_a_round_the_count_only_goes_up_whichever_host_reports() -> None:
    # Given host a reported step 150 of round 1
    recorded = Progress(150, 300, STEPS, 1)
    # When host b, a little behind, reports step 140 of the same round
    assert combine(recorded, Progress(140, 300, STEPS, 1)) == recorded
    # Then a newer step moves it on
    assert combine(recorded, Progress(160, 300, STEPS, 1)) == Progress(160, 300, STEPS, 1)


def test_a_restart_round_starts_from_its_checkpoint_and_an_older_rounds_word_is_stale() -> None:
    recorded = Progress(150, 300, STEPS, 1)
    # A restart resumed from the checkpoint of step 100: the job is at 104 now, not 150
    restarted = combine(recorded, Progress(104, None, STEPS, 2))
    assert restarted == Progress(104, 300, STEPS, 2)  # the total is kept
    # and a heartbeat of round 1 that crossed the change moves nothing
    assert combine(restarted, Progress(155, 300, STEPS, 1)) == restarted


def test_an_in_place_round_goes_on_from_the_round_it_carries_over() -> None:
    recorded = Progress(570, 3000, STEPS, 1)
    # The first heartbeat of round 2 (carried over from 1) may not have seen a step of its own
    assert combine(recorded, Progress(540, 3000, STEPS, 2), carried_from=1) == Progress(570, 3000, STEPS, 2)
    assert combine(recorded, Progress(600, 3000, STEPS, 2), carried_from=1) == Progress(600, 3000, STEPS, 2)


def test_the_shard_queue_counts_examples_over_every_epoch() -> None:
    values = {
        "queue_examples_done": 1_200_000.0,
        "queue_examples_per_epoch": 1_536_000.0,
        "queue_epochs": 2.0,
        "queue_epoch": 0.0,
        "queue_done": 781.0,
        "queue_shards_per_epoch": 1000.0,
    }
    assert from_queue(values, 3) == Progress(1_200_000, 3_072_000, EXAMPLES, 3)


def test_without_an_example_count_the_queue_counts_shards_and_a_finished_one_is_complete() -> None:
    running = {"queue_epochs": 2.0, "queue_epoch": 1.0, "queue_done": 250.0, "queue_shards_per_epoch": 1000.0}
    assert from_queue(running, 1) == Progress(1250, 2000, SHARDS, 1)
    # A finished queue reports epoch == epochs with the last epoch's shards all done
    finished = {**running, "queue_epoch": 2.0, "queue_done": 1000.0}
    assert from_queue(finished, 1) == Progress(2000, 2000, SHARDS, 1)
    assert from_queue({"queue_todo": 5.0}, 1) is None


@pytest.mark.parametrize(
    ("stored", "shown", "share"),
    [
        ({"step": 1200, "total": 4000, "unit": "steps", "round": 2}, "1,200/4,000 steps", 0.3),
        (
            {"step": 3_072_000, "total": 4_608_000, "unit": "examples", "round": 1},
            "3,072,000/4,608,000 examples",
            2 / 3,
        ),
        ({"step": 1250, "total": 2000, "unit": "shards", "round": 1}, "1,250/2,000 shards", 0.625),
        ({"step": 1200, "total": None, "unit": "steps", "round": 1}, "step 1,200", None),
        ({"step": 40, "total": 100}, "40/100 steps", 0.4),  # recorded before units
        ({}, "—", None),
    ],
)
def test_labels_name_the_unit_on_every_page_and_in_the_cli(
    stored: dict[str, Any], shown: str, share: float | None
) -> None:
    assert label(stored) == shown
    assert progress.fraction(stored) == share
    assert progress_text({"progress": stored}) == (shown if stored else "-").replace("—", "-")


# --- the controller, against PostgreSQL --------------------------------------------------------


def status(job: Job, number: int, last_step: int | None, total: int | None = None, **more: Any) -> Any:
    out: dict[str, Any] = {
        "job_id": job.pk,
        "round": number,
        "state": more.pop("state", protocol.RoundState.RUNNING),
        "ranks": [],
        "last_step": last_step,
        "first_step_at": time.time() if last_step is not None else None,
        **more,
    }
    if total is not None:
        out["total_steps"] = total
    return out


def beat(decide: Decide, node: str, *statuses: Any) -> Any:
    return decide(reports.apply_round_statuses, Node.objects.get(name=node), list(statuses))


def running(decide: Decide, job: Job) -> Job:
    decide(scheduler.tick)
    job.refresh_from_db()
    assert job.round_number == 1
    return job


def current(job: Job) -> Round:
    rnd = job.current_round()
    assert rnd is not None
    return rnd


def stored(job: Job) -> dict[str, Any]:
    job.refresh_from_db()
    return dict(job.progress)


def test_a_plain_script_counts_the_steps_it_logs_and_has_no_total(decide: Decide) -> None:
    make_node("a")
    job = running(decide, make_job("plain"))
    changed = beat(decide, "a", status(job, 1, 35))
    assert stored(job) == {"step": 35, "total": None, "unit": "steps", "round": 1}
    # and the change reaches the dashboard and the job's viewers (job.running, then the state)
    assert "job.running" in changed.kinds()


def test_an_sdk_scripts_own_total_comes_before_the_steps_hyperparameter(decide: Decide) -> None:
    make_node("a")
    job = make_job("sdk")
    Job.objects.filter(pk=job.pk).update(hyperparameters={"steps": 4000})
    job = running(decide, job)
    beat(decide, "a", status(job, 1, 10))
    assert stored(job)["total"] == 4000  # the hyperparameter, while the script has said nothing
    beat(decide, "a", status(job, 1, 20, total=2500))
    assert stored(job) == {"step": 20, "total": 2500, "unit": "steps", "round": 1}


def test_two_hosts_reporting_in_turn_never_move_the_step_back(decide: Decide) -> None:
    make_node("a")
    make_node("b")
    job = make_job("two", nnodes="2")
    Job.objects.filter(pk=job.pk).update(hyperparameters={"steps": 300})
    job = running(decide, job)
    beat(decide, "a", status(job, 1, 150))
    beat(decide, "b", status(job, 1, 140))
    assert stored(job)["step"] == 150


def test_an_in_place_job_goes_on_from_its_last_step_after_a_resize(decide: Decide) -> None:
    for name in "abc":
        make_node(name)
    job = make_job("inplace", nnodes="1:3")
    Job.objects.filter(pk=job.pk).update(inplace=True, desired_nodes=2, hyperparameters={"steps": 3000})
    job = running(decide, job)
    beat(decide, "a", status(job, 1, 570))
    decide(actions.resize_job, job.pk, 3, None)
    job.refresh_from_db()
    assert job.round_number == 2 and current(job).carry_over["from_round"] == 1
    # The joiner's host has logged nothing in round 2 yet; the survivors' hosts went on
    beat(decide, "c", status(job, 2, None, inplace="pending"))
    beat(decide, "b", status(job, 2, 560, inplace="pending"))
    assert stored(job) == {"step": 570, "total": 3000, "unit": "steps", "round": 2}
    beat(decide, "a", status(job, 2, 600, inplace="formed"))
    assert stored(job)["step"] == 600


def test_a_restart_round_reads_from_where_it_resumed(decide: Decide) -> None:
    make_node("a")
    job = make_job("restart")
    Job.objects.filter(pk=job.pk).update(hyperparameters={"steps": 300})
    job = running(decide, job)
    beat(decide, "a", status(job, 1, 150))
    decide(actions.restart_job, job.pk, None)
    job.refresh_from_db()
    assert job.round_number == 2 and current(job).reason == RoundReason.RESTART
    # The agent still lists round 1 beside round 2: its last steps, logged after its last
    # heartbeat, are where the job is until round 2 logs a step
    round_1_ended = status(job, 1, 180, state=protocol.RoundState.STOPPED)
    beat(decide, "a", status(job, 2, None), round_1_ended)
    assert stored(job) == {"step": 180, "total": 300, "unit": "steps", "round": 1}
    beat(decide, "a", status(job, 2, 104), round_1_ended)
    assert stored(job) == {"step": 104, "total": 300, "unit": "steps", "round": 2}
    beat(decide, "a", status(job, 2, 106), round_1_ended)  # round 1's word is stale by now
    assert stored(job)["step"] == 106


def ps_job(name: str = "ps", mode: str = "async") -> Job:
    job = Job(
        name=name,
        entrypoint="/bin/true",
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        strategy="parameter_server",
        roles={"ps": {"count": 2, "mode": mode}, "worker": {"count": 3, "min": 1, "max": 8}},
        hyperparameters={"steps": 4000},
        grace_period=12.0,
    )
    return actions.submit_job(job, None)


def log_points(job: Job, rank: int, step: int, values: dict[str, float], seq: int) -> None:
    """Points as ingest stores them (with their tiles)."""
    rows = [
        (job.pk, job.round_number, rank, seq, step, name, float(value), time.time())
        for name, value in values.items()
    ]
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)


def queue(examples_done: int, per_epoch: int = 3_072_000, epochs: int = 1) -> dict[str, float]:
    return {
        "queue_examples_done": examples_done,
        "queue_examples_per_epoch": per_epoch,
        "queue_epochs": epochs,
        "queue_epoch": 0,
        "queue_done": examples_done // 512,
        "queue_shards_per_epoch": per_epoch // 512,
    }


def ranks_of(job: Job) -> dict[str, int]:
    rnd = current(job)
    return {f"{p['role']} {p['index']}": int(p["rank"]) for a in rnd.allocations.all() for p in a.processes}


def host_of(job: Job, process: str) -> str:
    for alloc in current(job).allocations.select_related("node"):
        if any(f"{p['role']} {p['index']}" == process for p in alloc.processes):
            return str(alloc.node.name)
    raise AssertionError(f"no {process} in the round")


def end(job: Job) -> None:
    with decision():
        finish_job(Job.lock(job.pk), JobState.SUCCEEDED, "done")


@pytest.mark.parametrize("mode", ["async", "sync", "hybrid"])
def test_a_ps_job_counts_the_coordinators_examples_not_its_processes_own_counters(
    decide: Decide, mode: str
) -> None:
    make_node("a", slots=3)
    make_node("b", slots=3)
    job = running(decide, ps_job(mode=mode))
    ranks = ranks_of(job)
    # Given the processes' telemetry: worker 0 at push 4,220,928, PS 0 at version 9,000,000, and
    # the coordinator's queue at 1,228,800 of 3,072,000 examples
    log_points(job, ranks["worker 0"], 4_220_928, {"worker_examples": 2e6, "loss": 0.4}, seq=1)
    log_points(job, ranks["ps 0"], 9_000_000, {"ps_rows": 5e5}, seq=1)
    log_points(job, ranks["coordinator 0"], 1_228_800, queue(1_228_800), seq=1)
    # When the hosts heartbeat with their newest steps (the agent's max over every metric)
    coordinator_host = host_of(job, "coordinator 0")
    (other,) = {"a", "b"} - {coordinator_host}
    beat(decide, other, status(job, 1, 9_000_000))
    # Then a host without the coordinator reads nothing: no step count becomes progress
    assert stored(job) == {}
    beat(decide, coordinator_host, status(job, 1, 4_220_928))
    assert stored(job) == {"step": 1_228_800, "total": 3_072_000, "unit": "examples", "round": 1}
    assert label(job.progress) == "1,228,800/3,072,000 examples"


def test_a_finished_jobs_last_telemetry_settles_its_progress(decide: Decide) -> None:
    for name, slots in (("a", 3), ("b", 3), ("c", 1)):
        make_node(name, slots=slots)
    ps = running(decide, ps_job())
    coordinator = ranks_of(ps)["coordinator 0"]
    log_points(ps, coordinator, 2_900_000, queue(2_900_000), seq=1)
    beat(decide, host_of(ps, "coordinator 0"), status(ps, 1, 2_900_000))
    plain = make_job("plain")
    Job.objects.filter(pk=plain.pk).update(hyperparameters={"steps": 300})
    plain = running(decide, plain)
    host = current(plain).allocations.get().node.name
    beat(decide, host, status(plain, 1, 290))
    log_points(plain, 0, 290, {"loss": 0.5}, seq=1)
    # When both end, and their last points reach the database afterwards (the coordinator's
    # final report is written once it is stopped)
    decide(end, ps)
    decide(end, plain)
    log_points(ps, coordinator, 3_072_000, queue(3_072_000), seq=2)
    log_points(plain, 0, 300, {"loss": 0.4}, seq=2)
    assert stored(ps)["step"] == 2_900_000 and stored(plain)["step"] == 290
    # Then the tick's settling pass reads them
    assert progress.settle_finished() == 2
    assert stored(ps) == {"step": 3_072_000, "total": 3_072_000, "unit": "examples", "round": 1}
    assert stored(plain) == {"step": 300, "total": 300, "unit": "steps", "round": 1}
    assert progress.settle_finished() == 0  # and changes nothing twice


# --- the pages -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_jobs_list_and_the_dashboard_show_each_kinds_progress_with_its_unit(operator: Any) -> None:
    Job.objects.create(
        name="ps-running",
        workload="recsys-embedding",
        strategy="parameter_server",
        state=JobState.RUNNING,
        progress={"step": 1_228_800, "total": 3_072_000, "unit": "examples", "round": 1},
    )
    Job.objects.create(
        name="ddp-running",
        workload="digits-mlp",
        state=JobState.RUNNING,
        progress={"step": 1200, "total": 4000, "unit": "steps", "round": 2},
    )
    client = Client()
    client.force_login(operator)
    for url in ("/jobs/", "/"):
        page = client.get(url).content.decode()
        assert "1,228,800/3,072,000 examples" in page, url
        assert "1,200/4,000 steps" in page, url
        assert 'style="width: 40%"' in page and 'style="width: 30%"' in page


@pytest.mark.django_db
def test_the_last_logged_step_is_the_newest_tile_of_the_round_per_series() -> None:
    from django.utils import timezone

    from console.telemetry.models import MetricRollup

    job = make_job("steps")
    now = timezone.now()

    def tile(name: str, number: int, bucket: int, last: int) -> None:
        MetricRollup.objects.create(
            job=job, round_number=number, rank=0, name=name, bucket_step=bucket, last_step=last,
            min_value=0.0, max_value=1.0, total=1.0, count=1, first_time=now, last_time=now,
        )  # fmt: skip

    assert progress.last_logged_step(job, 1) is None
    tile("loss", 1, 0, 9)
    tile("loss", 1, 10, 14)
    tile("lr", 1, 0, 12)
    tile("loss", 2, 0, 3)  # another round
    tile("total_steps", 1, 100, 500)  # not a step of the script's
    tile("grad_norm/layer1", 1, 20, 40)  # per-layer norms are left out
    assert progress.last_logged_step(job, 1) == 14
    assert progress.last_logged_step(job, 2) == 3
