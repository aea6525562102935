"""The sweep form in Chromium: a search space that is not JSON, then one the API refuses, get
their messages beside the field (nothing stored); a valid form opens the new sweep's page. The
form and the sweeps list pass axe. (No controller runs: the sweep starts no trial here.)"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

from console.experiments.models import Sweep
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_sweep_form_errors_beside_fields_then_the_sweep(
    console_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect

    # Playwright's sync API runs an event loop in this thread; the ORM reads between its calls
    # are plain synchronous ones all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")

    user = User.objects.create_user("form-op", password="pw-form-op-1")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    with chromium() as browser:
        errors: list[str] = []
        page = new_page(browser, errors, color_scheme="light")
        log_in(page, console_url, "form-op", "pw-form-op-1")
        page.goto(f"{console_url}/sweeps/new/")
        assert_accessible(page, "sweep form")
        page.fill("#sweep-space", "{not json")
        page.click("#sweep-form button[type=submit]")
        expect(page.locator('[data-error-for="space"]')).to_contain_text("Not valid JSON")
        page.fill("#sweep-space", '{"lr": {"type": "float", "low": 1, "high": 0}}')
        page.click("#sweep-form button[type=submit]")
        expect(page.locator('[data-error-for="space"]')).to_contain_text("'low' (1) is above 'high' (0)")
        expect(page.locator("#sweep-space")).to_have_attribute("aria-invalid", "true")
        assert Sweep.objects.count() == 0
        page.fill("#sweep-space", '{"lr": {"type": "float", "low": 0.0001, "high": 0.1, "log": true}}')
        page.select_option("#sweep-pruner", "successive_halving")
        page.fill("#sweep-pruner-options", '{"min_resource": 30}')
        page.click("#sweep-form button[type=submit]")
        page.wait_for_url(re.compile(r"/sweeps/\d+/$"))
        sweep = Sweep.objects.get()
        assert sweep.pruner == "successive_halving" and sweep.pruner_options == {"min_resource": 30}
        assert sweep.owner == user and sweep.max_trials == 16
        expect(page.locator("h1")).to_contain_text("lr-search")
        page.goto(f"{console_url}/sweeps/")
        expect(page.locator(f'tr[data-sweep-id="{sweep.pk}"]')).to_be_visible()
        shot(page, "sweeps-list")
        assert_accessible(page, "sweeps list")
        assert errors == []
