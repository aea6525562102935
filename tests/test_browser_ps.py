"""The console's pages for a parameter_server job, in a real browser: the submit form offers the
strategy with its roles, the job page shows the roles with their counts, and an operator resizes
the worker role there (a bad count gets the API's message, nothing changes)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections

from console.jobs.models import Job
from tests.support.browser import assert_accessible, chromium, log_in, new_page

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
