"""The console's pages for a parameter_server job, in a real browser: the submit form offers the
strategy with its roles, the job page shows the roles with their counts, and an operator resizes
the worker role there (a bad count gets the API's message, nothing changes). With a real agent,
controller and ingest running a PS job, the page shows each PS's rows, memory and rates, each
worker's throughput and the shard queue from the processes' own telemetry, refreshed live."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections

from console.cluster.models import Node
from console.jobs import actions
from console.jobs.models import Job
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot
from tests.support.controller import wait_for
from tests.support.live import LiveConsole
from tests.support.ps import COUNT_WORKER

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def orm(call: Callable[[], Any]) -> Any:
    """Runs an ORM call off the thread where Playwright's sync API has its event loop."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(call())
        finally:
            connections.close_all()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return result[0] if result else None


def test_operator_submits_a_ps_job_and_resizes_its_worker_role(console_url: str) -> None:
    from playwright.sync_api import expect

    operator = User.objects.create_user("olivia", password="pw-operator-1")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    errors: list[str] = []
    with chromium() as browser:
        page = new_page(browser, errors)
        log_in(page, console_url, "olivia", "pw-operator-1")

        # Given the submit form: the roles appear only for the parameter_server strategy
        page.goto(f"{console_url}/jobs/new/")
        expect(page.locator("#ps-roles")).to_be_hidden()
        page.select_option("#f-strategy", "parameter_server")
        expect(page.locator("#ps-roles")).to_be_visible()
        page.fill("#f-name", "ps-from-the-form")
        page.fill("#f-entrypoint", "/bin/true")
        page.fill("#f-nnodes", "2")
        page.fill("#f-ps-count", "2")
        page.fill("#f-worker-count", "3")
        page.fill("#f-worker-max", "6")

        # When a worker count outside min..max is submitted, the roles' error says so
        page.fill("#f-worker-count", "7")
        page.click("#submit-button")
        expect(page.locator('.field-error[data-for="roles"]')).to_contain_text("within min..max")
        assert not orm(Job.objects.exists)

        # When it is fixed, the job is created with its roles and its page shows them
        page.fill("#f-worker-count", "3")
        page.click("#submit-button")
        page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
        job = orm(lambda: Job.objects.get(name="ps-from-the-form"))
        assert job.strategy == "parameter_server"
        assert job.roles == {"ps": {"count": 2, "mode": "async"}, "worker": {"count": 3, "min": 1, "max": 6}}
        expect(page.locator('#job-roles tr[data-role="ps"] .role-count')).to_have_text("2")
        expect(page.locator('#job-roles tr[data-role="worker"] .role-count')).to_have_text("3")
        assert_accessible(page, "ps job page")

        # When the operator resizes the worker role to 5 from the page, the job takes it
        page.fill("#resize-count", "5")
        page.click('#role-resize-form button[type="submit"]')
        expect(page.locator("#action-message")).to_have_text("Resize accepted.")
        expect(page.locator('#job-roles tr[data-role="worker"] .role-count')).to_have_text("5")
        orm(job.refresh_from_db)
        assert job.role_count("worker") == 5

        # And a count beyond the role's max gets the API's message and changes nothing
        page.fill("#resize-count", "9")
        page.click('#role-resize-form button[type="submit"]')
        expect(page.locator("#action-message")).to_contain_text("1..6")
        orm(job.refresh_from_db)
        assert job.role_count("worker") == 5
    assert errors == []


def number(text: str | None) -> float:
    match = re.search(r"[\d,.]+", text or "")
    assert match, f"no number in {text!r}"
    return float(match.group().replace(",", ""))


@pytest.mark.cluster
def test_the_job_page_shows_each_role_live_from_a_running_ps_job(
    live_console: LiveConsole, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    examples, shard = 20000, 200
    # Given an agent running a PS job: coordinator, 1 PS, 2 workers of the count worker
    User.objects.create_user("victor", password="pw-viewer-1").groups.add(
        Group.objects.get_or_create(name="viewer")[0]
    )
    live_console.agents.start("ps-node", heartbeat=1.0, extra_args=["--slots", "4"])
    wait_for(lambda: Node.objects.filter(state="ONLINE").count() == 1, timeout=60, message="agent")
    job = actions.submit_job(
        Job(
            name="ps-live",
            entrypoint=COUNT_WORKER,
            workdir=str(Path(COUNT_WORKER).parent),
            args=[
                str(tmp_path / "summary-{index}.json"),
                *("--examples", str(examples), "--shard-size", str(shard), "--batch-size", "50"),
                *("--sleep", "0.05"),
            ],
            env={
                "TRAINYARD_PS_STATS_EVERY_S": "1",
                "TRAINYARD_PS_LEASE_S": "5",
                "TRAINYARD_PS_CHECKPOINT_EVERY_S": "1",
            },
            strategy="parameter_server",
            roles={"ps": {"count": 1, "mode": "async"}, "worker": {"count": 2, "min": 1, "max": 4}},
            grace_period=5.0,
        ),
        None,
    )
    errors: list[str] = []
    with chromium() as browser:
        page = new_page(browser, errors)
        log_in(page, live_console.url, "victor", "pw-viewer-1")
        page.goto(f"{live_console.url}/jobs/{job.pk}/")

        # Then PS 0's row shows the rows it holds, its memory and its pull/push rates and latency
        ps0 = page.locator('#ps-servers-body tr[data-ps="0"]')
        expect(ps0.locator(".ps-rows")).to_have_text(re.compile(r"^[1-9][\d,]*$"), timeout=120000)
        rows = number(ps0.locator(".ps-rows").text_content())
        assert 0 < rows <= examples
        expect(ps0.locator(".ps-memory")).to_contain_text("MiB")
        expect(ps0.locator(".ps-pull-latency")).to_have_text(re.compile(r"^[\d.e+-]+ / [\d.e+-]+ ms$"))
        expect(ps0.locator(".ps-pushes")).not_to_have_text(re.compile("^(0|\u2013)$"), timeout=30000)

        # And each worker its throughput; the queue its shards, which add up to the epoch's
        for index in (0, 1):
            rate = page.locator(f'#ps-workers-body tr[data-worker="{index}"] .worker-rate')
            expect(rate).not_to_have_text(re.compile("^(0|\u2013)$"), timeout=60000)
            assert number(rate.text_content()) > 0
        expect(page.locator('#ps-queue [data-queue="epoch"]')).to_have_text("epoch 1 of 1", timeout=30000)
        counts = [
            int(number(page.locator(f'#ps-queue [data-queue="{key}"]').text_content()))
            for key in ("done", "in-progress", "todo")
        ]
        assert sum(counts) == examples // shard, counts

        # And the rows are patched live as the PS takes in more rows
        expect(ps0.locator(".ps-rows")).not_to_have_text(f"{int(rows):,}", timeout=30000)
        assert number(ps0.locator(".ps-rows").text_content()) > rows

        # And progress counts the coordinator's examples out of the dataset's, not steps
        progress = page.locator("#job-progress")
        expect(progress).to_have_text(re.compile(r"^[1-9][\d,]*/20,000 examples$"), timeout=30000)
        done = number(progress.text_content())
        assert 0 < done <= examples
        # the role series are a chart per role, each process a line
        expect(page.locator("#role-charts .chart")).to_have_count(3)
        expect(page.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text("PS 0 ", timeout=30000)
        expect(page.locator('[data-chart="role-worker"] .chart-legend')).to_contain_text(
            "worker 1 ", timeout=30000
        )
        expect(page.locator('[data-chart^="other"]')).to_have_count(0)
        # and the PS's checkpoints are listed as they are written
        expect(page.locator("#checkpoints-body tr").first).to_contain_text(
            "ps-0000-of-0001.pt", timeout=30000
        )
        expect(page.locator("#checkpoints-empty")).to_be_hidden()
        # the rounds table names each allocation's processes
        expect(page.locator("#rounds-body tr.current .allocs li")).to_contain_text(
            "coordinator, PS 0, worker 0, worker 1"
        )
        assert_accessible(page, "ps job page with role statistics")
        shot(page, "job-ps-live")

        # When every example is done the job succeeds, and its progress is complete
        expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=120000)
        expect(progress).to_have_text("20,000/20,000 examples", timeout=30000)
    orm(job.refresh_from_db)
    assert job.progress == {"step": examples, "total": examples, "unit": "examples", "round": 1}
    assert errors == []
