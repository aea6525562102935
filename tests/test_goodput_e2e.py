"""Goodput of a scripted job with real agents, a controller, ingest and the web server: the job
waits in the queue until its agent comes, trains with the SDK (a data wait before each step, a
checkpoint every 10), fails once at step 35 and resumes from step 30's checkpoint. Its breakdown
adds up to its wall time, each bucket holds what the script and the rounds say, and the job page
draws it (a stacked bar over time, with a screenshot in artifacts/)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect
from rest_framework.test import APIClient

from console.core.states import JobState
from console.jobs.models import Job
from console.telemetry.models import Metric
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot
from tests.support.controller import wait_for
from tests.support.live import LiveConsole

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]
SCRIPT = Path(__file__).parent / "scripts" / "goodput_job.py"
STEPS, SLEEP, DATA_WAIT, FAIL_AT, EVERY = 60, 0.1, 0.025, 35, 10
QUEUED_FOR = 4.0


def test_the_goodput_of_a_scripted_job_adds_up_and_is_drawn(live_console: LiveConsole) -> None:
    user = User.objects.create_user("gina", password="pw-goodput-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    body = {
        "name": "goodput-scripted",
        "entrypoint": str(SCRIPT),
        "workdir": str(SCRIPT.parent),
        "args": [
            "--steps",
            str(STEPS),
            "--sleep",
            str(SLEEP),
            "--data-wait",
            str(DATA_WAIT),
            "--fail-at-step",
            str(FAIL_AT),
            "--checkpoint-every",
            str(EVERY),
        ],
        "nnodes": "1",
        "max_restarts": 2,
        "grace_period": 5,
    }
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    # No agent yet: the job waits in the queue (the point of the test, not a wait for a condition).
    time.sleep(QUEUED_FOR)
    live_console.start_agents("gp-a")

    def ended() -> Job | None:
        job.refresh_from_db()
        return job if job.job_state.is_terminal else None

    wait_for(ended, timeout=240, message="the job to end")
    assert job.state == JobState.SUCCEEDED, job.failure
    rounds = list(job.rounds.order_by("number"))
    assert [r.reason for r in rounds] == ["start", "failure"]
    # Every step's loss is stored (ingest runs behind the agent): rounds 1..35, then 31..60.
    wait_for(
        lambda: Metric.objects.filter(job=job, name="loss").count() == FAIL_AT + (STEPS - 30),
        timeout=60,
        message="every loss point stored",
    )

    figure = api.get(f"/api/v1/jobs/{job.pk}/goodput/?bins=30").json()
    seconds = figure["seconds"]
    assert job.finished_at is not None
    wall = (job.finished_at - job.created_at).total_seconds()
    assert figure["wall_seconds"] == pytest.approx(wall)
    assert sum(seconds.values()) == pytest.approx(wall)
    # Queued: from submission to the first round.
    assert seconds["queued"] == pytest.approx(
        (rounds[0].created_at - job.created_at).total_seconds(), abs=0.01
    )
    assert seconds["queued"] >= QUEUED_FOR
    assert seconds["starting"] > 0 and seconds["restoring"] > 0
    # Steps 31..35 again: five steps of ~0.125 s each.
    per_step = SLEEP + DATA_WAIT
    assert 3 * per_step <= seconds["redone"] <= 5 * per_step * 2.5
    assert seconds["checkpoint"] > 0
    # The data wait is a fifth of a step (0.025 of 0.125 s), within what a loaded machine adds.
    share = seconds["data"] / (seconds["data"] + seconds["productive"])
    assert 0.08 < share < 0.35
    # Productive time holds the 60 steps at most once each, and most of them.
    assert 0.6 * STEPS * SLEEP < seconds["productive"] < STEPS * per_step * 1.5
    assert 0 < figure["goodput"] < 1
    assert len(figure["bins"]) == 30

    errors: list[str] = []
    with chromium() as browser:
        page = new_page(browser, errors)
        log_in(page, live_console.url, "gina", "pw-goodput-1")
        page.goto(f"{live_console.url}/jobs/{job.pk}/")
        bar = page.locator("#goodput-bar")
        expect(bar.locator("rect").first).to_be_attached()
        expect(page.locator("#goodput-legend li[data-bucket=restoring]")).to_be_visible()
        expect(page.locator("#goodput-legend li[data-bucket=redone]")).to_be_visible()
        expect(page.locator("#goodput-figure")).to_contain_text("% productive")
        # The first slices are the queue (grey), the bar's label names every bucket it shows.
        assert bar.locator("g[data-bin='0'] rect").first.get_attribute("data-bucket") == "queued"
        assert "restoring" in (bar.get_attribute("aria-label") or "")
        page.locator("#goodput-card").scroll_into_view_if_needed()
        page.locator("#goodput-card").screenshot(
            path=str(shot(page, "goodput-job-page").with_name("goodput-card.png"))
        )
        assert_accessible(page, "job page with goodput", exclude=["#log-viewport"])
        # The dashboard's figure: this job, within the last day.
        page.goto(f"{live_console.url}/")
        expect(page.locator("#cluster-goodput [data-window=day]")).to_contain_text("1 job")
        shot(page, "goodput-dashboard", full_page=False)
    assert errors == []
