"""A sweep with real agents, controller and ingest, then its trials compared in a browser.

Given a grid sweep of 4 digits-mlp trials (learning rate 0.01 or 1e-5, two widths), one at a time,
with successive halving on test_loss (reduction factor 2: a trial goes on past a rung only if it
is in the better half of the trials that reached it): when the controller is SIGKILLed while the sweep runs and
started again, the sweep goes on from PostgreSQL and ends SUCCEEDED with 4 trials; a trial that
learns nothing was stopped through the console's stop (its job STOPPED, a sweep.trial_pruned
event), and the best trial is the first, wide one at 0.01. Then, in Chromium, 3 trials picked by their checkboxes on the jobs
list open a comparison (charts drawn, the differing hyperparameters, final and best values, a link
that reopens it), and the sweep page shows its trials and plots; axe finds no serious or critical
violation on either, in the dark and the light theme; screenshots in artifacts/.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from console.core.states import JobState
from console.experiments.models import Sweep, SweepState, TrialState
from console.telemetry.models import Event
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot
from tests.support.controller import wait_for
from tests.support.live import LiveConsole

pytestmark = [pytest.mark.cluster, pytest.mark.browser, pytest.mark.timeout(600)]
PASSWORD = "pw-sweep-e2e-1"

SWEEP = {
    "name": "sweep-e2e",
    "job": {
        "workload": "digits-mlp",
        "grace_period": 5,
        "hyperparameters": {"steps": 2500, "log_every": 20, "checkpoint_every": 0, "watch_every": 1000},
    },
    "space": {"lr": [0.01, 1e-05], "hidden": [16, 64]},
    "sampler": "grid",
    "seed": 0,  # the grid's order: (0.01, 64), (1e-5, 64), (1e-5, 16), (0.01, 16)
    "objective": "test_loss",
    "max_trials": 4,
    "parallel": 1,
    "pruner": "successive_halving",
    "pruner_options": {"min_resource": 20, "reduction_factor": 2},
}


def test_sweep_prunes_resumes_and_its_trials_compare(live_console: LiveConsole) -> None:
    user = User.objects.create_user("sweep-op", password=PASSWORD)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    live_console.start_agents("sw-a")
    created = api.post("/api/v1/sweeps/", SWEEP, format="json")
    assert created.status_code == 201, created.content
    sweep = Sweep.objects.get(pk=created.json()["id"])

    # The controller dies while the second trial runs, and comes back.
    wait_for(lambda: sweep.trials.filter(number=1).exists(), timeout=240, message="trial 1 to start")
    live_console.controller.kill()
    before = sweep.trials.count()
    live_console.controller.start()

    def ended() -> Sweep | None:
        sweep.refresh_from_db()
        return sweep if sweep.state != SweepState.RUNNING else None

    wait_for(ended, timeout=400, message="the sweep to end")
    assert sweep.state == SweepState.SUCCEEDED, sweep.message
    trials = list(sweep.trials.select_related("job").order_by("number"))
    assert before < 4 and len(trials) == 4
    assert [t.params for t in trials] == [
        {"lr": 0.01, "hidden": 64},
        {"lr": 1e-05, "hidden": 64},
        {"lr": 1e-05, "hidden": 16},
        {"lr": 0.01, "hidden": 16},
    ]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    summary = [(t.number, t.state, t.value, t.message) for t in trials]
    assert any(t.params["lr"] == 1e-05 for t in pruned), summary
    for trial in pruned:  # losing at its rung, stopped through the console
        assert trial.job is not None and trial.job.state == JobState.STOPPED
        assert Event.objects.filter(job=trial.job, kind="sweep.trial_pruned").exists()
        assert (trial.last_step or 0) < 2500
    best = api.get(f"/api/v1/sweeps/{sweep.pk}/").json()["best"]
    assert best["number"] == 0 and best["value"] < 1.0, summary

    picked = [t.job for t in trials if t.job is not None][:3]
    with chromium() as browser:
        for scheme in ("dark", "light"):
            errors: list[str] = []
            page = new_page(browser, errors, color_scheme=scheme)
            log_in(page, live_console.url, "sweep-op", PASSWORD)
            page.goto(f"{live_console.url}/jobs/?name=sweep-e2e-")
            for job in picked:
                page.check(f'input.compare-pick[value="{job.pk}"]')
            from playwright.sync_api import expect

            expect(page.locator("#compare-count")).to_contain_text("3 jobs picked")
            page.click("#compare-selected")
            page.wait_for_url(re.compile(r"/compare/\?jobs="))
            page.wait_for_function(
                "() => performance.getEntriesByName('chart-drawn:m-test_loss').length > 0", timeout=30000
            )
            # Every other chart loads after the first (a few requests at a time).
            page.wait_for_function(
                "() => [...document.querySelectorAll('#charts .chart-empty')].every((e) => e.hidden)",
                timeout=30000,
            )
            expect(page.locator("#hp-table tbody tr")).to_have_count(2)  # hidden and lr differ
            expect(page.locator("#hp-table")).to_contain_text("1e-5")
            expect(page.locator("#values-table")).to_contain_text("test_loss (lower is better)")
            assert page.locator("[data-chart]").count() >= 3
            link = page.locator("#compare-link").get_attribute("href") or ""
            assert all(str(job.pk) in link for job in picked)
            shot(page, f"compare-{scheme}")
            assert_accessible(page, f"compare page ({scheme})")

            page.goto(f"{live_console.url}/sweeps/{sweep.pk}/")
            expect(page.locator("#trials-table tbody tr")).to_have_count(4)
            expect(page.locator("#trials-table tbody tr[data-state=PRUNED]").first).to_be_visible()
            expect(page.locator("#parallel svg polyline").first).to_be_attached()
            assert page.locator("#sweep-plots svg").count() == 3  # by trial, by lr, by hidden
            shot(page, f"sweep-{scheme}")
            assert_accessible(page, f"sweep page ({scheme})")
            assert errors == []
            page.context.close()
