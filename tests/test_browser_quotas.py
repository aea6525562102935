"""The quotas page and the dashboard in Chromium: each workspace's use, quota and borrowing in a
pool, and a pending job's reason as the scheduler gave it (over quota). The scheduler's pass runs
in-process on the seeded rows (no agents); the pages pass axe; screenshots land in artifacts/."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from console.cluster.models import Node
from console.core import transport
from console.jobs import scheduler
from console.jobs.models import Job
from console.teams.models import Membership, NodePool, Quota, Resource, Role, Workspace
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


class Dropped:
    def send(self, command: Any) -> None:
        return None


def test_quotas_page_and_a_pending_jobs_reason(console_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import expect

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    user = User.objects.create_user("team-lead", password="pw-team-lead-1")
    red, blue = Workspace.objects.create(name="red", weight=2), Workspace.objects.create(name="blue")
    Membership.objects.create(workspace=red, user=user, role=Role.ADMIN)
    pool = NodePool.objects.create(name="cpu", selector={"kind": "cpu"}, resource=Resource.CPU)
    Quota.objects.create(workspace=red, pool=pool, nominal=2, borrowing_limit=1)
    Quota.objects.create(workspace=blue, pool=pool, nominal=2)
    for index in range(4):
        Node.objects.create(
            name=f"c{index}",
            slots=1,
            labels={"kind": "cpu"},
            address="127.0.0.1",
            last_heartbeat=timezone.now(),
        )
    for name, nnodes in (("train-a", 2), ("train-b", 1), ("train-c", 1)):
        Job.objects.create(
            name=name,
            entrypoint="/bin/true",
            min_nodes=nnodes,
            max_nodes=nnodes,
            desired_nodes=nnodes,
            workspace=red,
            pool=pool,
        )
    with transport.use(Dropped()):
        scheduler.schedule()
    waiting = Job.objects.get(name="train-c")
    assert waiting.state == "PENDING" and waiting.wait_reason.startswith("Over quota: red would use 4")

    with chromium() as browser:
        errors: list[str] = []
        page = new_page(browser, errors, color_scheme="light")
        log_in(page, console_url, "team-lead", "pw-team-lead-1")
        page.goto(f"{console_url}/quotas/")
        red_row = page.locator('#quota-table tr[data-workspace="red"]')
        expect(red_row.locator(".used")).to_have_text("3")
        expect(red_row.locator(".nominal")).to_have_text("2")
        expect(red_row.locator(".borrowed")).to_have_text("1")
        expect(red_row.locator(".pending")).to_have_text("1")
        expect(red_row).to_contain_text("(yours)")
        reason = page.locator(f'#waiting-table tr[data-job-id="{waiting.pk}"] .why')
        expect(reason).to_contain_text("Over quota: red would use 4 in pool cpu, its quota is 2")
        assert_accessible(page, "quotas page")
        shot(page, "quotas")
        page.goto(f"{console_url}/")
        expect(page.locator("#quota-card")).to_contain_text("red")
        expect(page.locator(f'#queue-table tr[data-job-id="{waiting.pk}"] .why')).to_contain_text(
            "Over quota"
        )
        shot(page, "dashboard-quotas")
        assert errors == []
