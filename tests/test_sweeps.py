"""Sweeps decided in process against the real PostgreSQL: given a sweep submitted through the API,
each controller pass (sweeps.advance_sweeps) starts trials as jobs up to the parallel limit,
reads the objective they report, settles the ones whose job ended, stops losers through the
jobs' own stop action, and ends the sweep once the budget has run. No agent runs: the jobs'
reports are rows written here, as ingest writes them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.core.states import JobState
from console.experiments import sweeps
from console.experiments.models import Sweep, SweepState, TrialState
from console.jobs.models import Job
from console.telemetry.models import Event, Metric
from tests.support.decisions import Decide

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def sweep_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "lr-search",
        "job": {"workload": "digits-mlp", "hyperparameters": {"steps": 90, "log_every": 10}},
        "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True}, "hidden": [16, 32, 64]},
        "sampler": "random",
        "seed": 7,
        "objective": "test_loss",
        "max_trials": 4,
        "parallel": 2,
    }
    body.update(changes)
    return body


def client(user: User) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def report(job: Job | None, values: dict[int, float], seq0: int = 0) -> None:
    assert job is not None
    Metric.objects.bulk_create(
        Metric(job=job, round_number=1, rank=0, seq=seq0 + i, step=step, name="test_loss", value=v, time=NOW)
        for i, (step, v) in enumerate(sorted(values.items()))
    )


def end(job: Job | None, state: JobState) -> None:
    assert job is not None
    Job.objects.filter(pk=job.pk).update(state=state)


def test_submit_checks_the_space_the_pruner_and_the_job_spec(operator: User, viewer: User) -> None:
    api = client(operator)
    bad_space = api.post(
        "/api/v1/sweeps/", sweep_body(space={"lr": {"type": "float", "low": 1, "high": 0}}), format="json"
    )
    assert bad_space.status_code == 400
    assert "'low' (1) is above 'high' (0)" in bad_space.json()["errors"]["space"][0]
    grid = api.post("/api/v1/sweeps/", sweep_body(sampler="grid"), format="json")
    assert "the grid sampler needs 'choices' or a 'step'" in grid.json()["errors"]["space"][0]
    job = api.post("/api/v1/sweeps/", sweep_body(job={"workload": "nope"}), format="json")
    assert "Unknown workload 'nope'" in job.json()["errors"]["job"][0]
    hp = api.post("/api/v1/sweeps/", sweep_body(space={"hidden": [0, 16]}), format="json")
    assert "'hidden' must be at least 1" in hp.json()["errors"]["job"][0]
    pruner = api.post(
        "/api/v1/sweeps/", sweep_body(pruner="median", pruner_options={"min_resource": 3}), format="json"
    )
    assert (
        "unknown option(s) for the median pruner: min_resource"
        in pruner.json()["errors"]["pruner_options"][0]
    )
    assert client(viewer).post("/api/v1/sweeps/", sweep_body(), format="json").status_code == 403
    assert Sweep.objects.count() == 0

    created = api.post("/api/v1/sweeps/", sweep_body(), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["state"] == "RUNNING" and created.json()["trials"] == []


def test_trials_start_up_to_the_parallel_limit_and_the_budget(operator: User, decide: Decide) -> None:
    sweep_id = client(operator).post("/api/v1/sweeps/", sweep_body(), format="json").json()["id"]

    decide(sweeps.advance_sweeps)
    sweep = Sweep.objects.get(pk=sweep_id)
    trials = list(sweep.trials.order_by("number"))
    assert [t.number for t in trials] == [0, 1] and all(t.state == TrialState.RUNNING for t in trials)
    for trial in trials:
        job = trial.job
        assert job is not None and job.state == JobState.PENDING and job.owner == operator
        assert job.name == f"lr-search-t{trial.number}"
        assert job.hyperparameters["lr"] == trial.params["lr"] and job.hyperparameters["steps"] == 90
        assert 1e-4 <= trial.params["lr"] <= 0.1 and trial.params["hidden"] in (16, 32, 64)
    assert trials[0].params != trials[1].params

    decide(sweeps.advance_sweeps)  # nothing ended: no third trial
    assert sweep.trials.count() == 2

    report(trials[0].job, {10: 2.0, 20: 1.5, 90: 0.4})
    end(trials[0].job, JobState.SUCCEEDED)
    report(trials[1].job, {10: 2.2})
    end(trials[1].job, JobState.FAILED)
    decide(sweeps.advance_sweeps)
    trials = list(sweep.trials.order_by("number"))
    assert [t.state for t in trials] == ["COMPLETE", "FAILED", "RUNNING", "RUNNING"]
    assert trials[0].value == 0.4 and trials[0].intermediate == {"10": 2.0, "20": 1.5, "90": 0.4}

    for trial in trials[2:]:
        end(trial.job, JobState.SUCCEEDED)  # without reporting the objective
    decide(sweeps.advance_sweeps)
    sweep.refresh_from_db()
    assert sweep.trials.count() == 4
    assert sweep.state == SweepState.SUCCEEDED and sweep.finished_at is not None
    assert "Best: trial 0 (test_loss 0.4)" in sweep.message
    assert list(sweep.trials.order_by("number").values_list("state", flat=True)) == [
        "COMPLETE",
        "FAILED",
        "FAILED",
        "FAILED",
    ]
    assert "without reporting the objective" in sweep.trials.get(number=2).message


def test_successive_halving_stops_a_losing_trial_through_the_job_stop(operator: User, decide: Decide) -> None:
    body = sweep_body(
        pruner="successive_halving", pruner_options={"min_resource": 10, "reduction_factor": 2}, parallel=2
    )
    sweep_id = client(operator).post("/api/v1/sweeps/", body, format="json").json()["id"]
    decide(sweeps.advance_sweeps)
    sweep = Sweep.objects.get(pk=sweep_id)
    first, second = sweep.trials.order_by("number")
    report(first.job, {10: 1.0, 20: 0.8})
    decide(sweeps.advance_sweeps)  # the first to reach each rung is promoted
    first.refresh_from_db()
    assert first.state == TrialState.RUNNING and first.system_attrs["completed_rung_0"] == 1.0

    report(second.job, {10: 3.0})
    done = decide(sweeps.advance_sweeps)
    second.refresh_from_db()
    job = Job.objects.get(pk=int(second.job_id or 0))
    assert second.state == TrialState.PRUNED and second.value == 3.0
    assert job.state == JobState.STOPPED  # the console's own stop: its round ended, ranks told
    assert "Pruned at step 10 (test_loss 3)" in second.message
    assert done.kinds() == ["sweep.trial_pruned", "job.stopped", "job.submitted"]
    assert Event.objects.filter(job=job, kind="sweep.trial_pruned").exists()
    # Its place went to the next trial.
    assert sweep.trials.filter(state=TrialState.RUNNING).count() == 2


def test_stop_ends_the_sweep_and_its_running_trials(operator: User, decide: Decide) -> None:
    api = client(operator)
    sweep_id = api.post("/api/v1/sweeps/", sweep_body(), format="json").json()["id"]
    decide(sweeps.advance_sweeps)

    stopped = api.post(f"/api/v1/sweeps/{sweep_id}/stop/")
    assert stopped.status_code == 200 and stopped.json()["state"] == "STOPPED"
    assert {t["state"] for t in stopped.json()["trials"]} == {"STOPPED"}
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.STOPPED}
    assert api.post(f"/api/v1/sweeps/{sweep_id}/stop/").status_code == 409
    decide(sweeps.advance_sweeps)
    assert Sweep.objects.get(pk=sweep_id).trials.count() == 2  # a stopped sweep starts nothing


def test_args_take_the_parameters_and_env_values_stay_with_the_owner(
    operator: User, viewer: User, decide: Decide
) -> None:
    body = sweep_body(
        job={
            "entrypoint": "/bin/true",
            "args": ["--lr={lr}", "--hidden", "{hidden}", "{other}"],
            "env": {"TOKEN": "s3cret"},
        },
        sampler="grid",
        space={"lr": [0.1, 0.01], "hidden": [8]},
    )
    sweep_id = client(operator).post("/api/v1/sweeps/", body, format="json").json()["id"]
    decide(sweeps.advance_sweeps)
    jobs = {tuple(t.job.args) for t in Sweep.objects.get(pk=sweep_id).trials.all() if t.job is not None}
    assert jobs == {("--lr=0.1", "--hidden", "8", "{other}"), ("--lr=0.01", "--hidden", "8", "{other}")}
    seen = client(viewer).get(f"/api/v1/sweeps/{sweep_id}/").json()
    assert seen["job"]["env"] == {"TOKEN": "(hidden)"}
    assert client(operator).get(f"/api/v1/sweeps/{sweep_id}/").json()["job"]["env"] == {"TOKEN": "s3cret"}
    # A grid of two points ends after two trials whatever the budget.
    for trial in Sweep.objects.get(pk=sweep_id).trials.all():
        end(trial.job, JobState.SUCCEEDED)
    decide(sweeps.advance_sweeps)
    assert Sweep.objects.get(pk=sweep_id).state == SweepState.SUCCEEDED
