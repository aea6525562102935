"""One walk through the console in headless Chromium: log in, dashboard, job page, submit.

The console is served by a real Daphne process against the test database; screenshots land in
artifacts/ for a human to look at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core.models import AuditEntry
from console.jobs.models import Allocation, Job, Round
from console.telemetry.models import Event, Metric

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"


def make_cluster(owner: User) -> Job:
    now = timezone.now()
    nodes = []
    for i, (name, gpus) in enumerate([("gpu-a", 4), ("gpu-b", 4), ("cpu-c", 0)]):
        node = Node.objects.create(
            name=name,
            hostname=f"{name}.lab",
            address=f"10.0.0.{i + 1}",
            cpus=32,
            memory_bytes=256 * 2**30,
            slots=8,
            cpu_percent=20.0 + 25 * i,
            memory_percent=35.0 + 10 * i,
            last_heartbeat=now,
            state="DRAINING" if name == "cpu-c" else "ONLINE",
        )
        for g in range(gpus):
            Gpu.objects.create(node=node, index=g, name="NVIDIA A100-SXM4-80GB", utilization=80.0)
        nodes.append(node)
    for i, state in enumerate(["SUCCEEDED", "FAILED", "PENDING", "STOPPED"]):
        Job.objects.create(name=f"sweep-{i}", workload="digits", owner=owner, state=state)
    job = Job.objects.create(
        name="tiny-lm-elastic",
        workload="tiny-lm",
        owner=owner,
        min_nodes=1,
        max_nodes=3,
        desired_nodes=2,
        nproc_per_node=2,
        state="RUNNING",
        round_number=2,
        restarts=1,
        progress={"step": 180, "total_steps": 300},
        hyperparameters={"lr": 0.003, "batch_size": 16, "steps": 300},
        started_at=now,
    )
    for number, reason, members in [(1, "start", nodes[:1]), (2, "resize", nodes[:2])]:
        rnd = Round.objects.create(
            job=job,
            number=number,
            reason=reason,
            world_size=2 * len(members),
            master_addr="10.0.0.1",
            master_port=29500 + number,
            outcome="resized" if number == 1 else "",
        )
        for rank, node in enumerate(members):
            Allocation.objects.create(
                round=rnd,
                node=node,
                node_rank=rank,
                nproc=2,
                gpu_indices=[0, 1],
                state="STOPPED" if number == 1 else "RUNNING",
            )
    for kind, severity, message in [
        ("job.submitted", "info", "Submitted by olivia"),
        ("round.started", "info", "Round 1 started on gpu-a (world 2)"),
        ("job.resize", "info", "Resize to 2 nodes requested"),
        ("round.started", "info", "Round 2 started on gpu-a, gpu-b (world 4)"),
        ("anomaly.loss_spike", "warning", "Loss jumped 3.1x at step 150"),
    ]:
        Event.objects.create(job=job, kind=kind, severity=severity, message=message)
    for step in range(0, 181, 2):
        value = 4.0 * (0.985**step) + 0.3 + (0.5 if step == 150 else 0.0)
        Metric.objects.create(
            job=job,
            round_number=1 if step < 100 else 2,
            rank=0,
            seq=step,
            step=step,
            name="loss",
            value=value,
            time=now,
        )
    return job


def test_operator_walks_through_the_console(console_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    operator = User.objects.create_user("olivia", password="pw-operator-1")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    job = make_cluster(operator)
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # Given the login page
            page.goto(console_url + "/")
            expect(page).to_have_url(console_url + "/accounts/login/?next=/")
            page.screenshot(path=str(ARTIFACTS / "login.png"))
            # When the operator signs in
            page.fill('input[name="username"]', "olivia")
            page.fill('input[name="password"]', "pw-operator-1")
            page.click('button[type="submit"]')
            # Then the dashboard shows the cluster
            expect(page.locator("h1")).to_have_text("Cluster")
            expect(page.locator("#job-table")).to_contain_text("tiny-lm-elastic")
            expect(page.locator("#node-table")).to_contain_text("gpu-b")
            expect(page.locator("#live-status")).not_to_have_text("connecting…", timeout=15000)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # When the operator drains a node from the nodes page
            page.click("nav >> text=Nodes")
            row = page.locator('#node-table tr:has-text("gpu-b")')
            row.locator('[data-node-action="drain"]').click()
            expect(row.locator('[data-field="state"]')).to_have_text("DRAINING")
            expect(row.locator('[data-node-action="undrain"]')).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "nodes.png"), full_page=True)

            # When the operator opens the job
            page.click("nav >> text=Dashboard")
            page.click("text=tiny-lm-elastic")
            expect(page.locator("#job-state")).to_have_text("RUNNING")
            expect(page.locator("#events")).to_contain_text("Loss jumped")
            expect(page.locator("#chart-legend")).to_contain_text("loss")
            # A resize outside min..max is refused before it reaches the API
            page.fill("#resize-nodes", "7")
            page.click('#resize-form button[type="submit"]')
            expect(page.locator("#action-message")).to_have_text("Nodes must be a whole number from 1 to 3.")
            page.screenshot(path=str(ARTIFACTS / "job.png"), full_page=True)

            # When the operator stops the job, the API's answer updates the page
            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#stop-button")
            expect(page.locator("#action-message")).not_to_have_text("stop…", timeout=15000)
            stop_message = page.locator("#action-message").text_content() or ""

            # And the submit form shows the API's field errors, then submits
            page.goto(console_url + "/jobs/new/")
            page.select_option("#f-workload", "digits-mlp")
            expect(page.locator("#f-hp")).to_have_value(re.compile(r'"steps": 300'))
            page.fill("#f-name", "bad name!")
            page.fill("#f-nnodes", "3:2")
            page.click("#submit-button")
            expect(page.locator('.field-error[data-for="name"]')).not_to_be_empty()
            expect(page.locator('.field-error[data-for="nnodes"]')).not_to_be_empty()
            page.screenshot(path=str(ARTIFACTS / "submit.png"), full_page=True)
            # A dashboard open in another tab hears of the submission over its websocket
            watcher = context.new_page()
            watcher.goto(console_url + "/")
            expect(watcher.locator("#live-status")).to_have_text("live", timeout=15000)
            page.fill("#f-name", "digits-from-browser")
            page.fill("#f-nnodes", "1")
            page.click("#submit-button")
            page.wait_for_url(f"{console_url}/jobs/*/")
            expect(page.locator("h1")).to_contain_text("digits-from-browser")
            page.screenshot(path=str(ARTIFACTS / "submitted.png"), full_page=True)
            expect(watcher.locator("#new-jobs")).to_have_text("1 new job · show", timeout=15000)

            # Without websockets the job page polls, and still sees another tab stop the job
            offline = context.new_page()
            offline.route_web_socket(re.compile(r".*/ws/.*"), lambda ws: ws.close())
            offline.goto(page.url)
            expect(offline.locator("#live-status")).to_have_text(re.compile("polling"), timeout=15000)
            expect(offline.locator("#job-state")).to_have_text("PENDING")
            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#stop-button")
            expect(page.locator("#action-message")).to_have_text("Stop accepted.", timeout=15000)
            expect(offline.locator("#job-state")).to_have_text("STOPPED", timeout=15000)
            expect(offline.locator("#events")).to_contain_text("Stopped", timeout=15000)
            offline.screenshot(path=str(ARTIFACTS / "job_polling.png"), full_page=True)
        finally:
            browser.close()

    # Playwright's sync API runs an event loop in this thread, so the ORM waits until it is gone.
    assert errors == []
    assert stop_message == "Stop accepted."
    job.refresh_from_db()
    assert job.state == "STOPPED"
    assert Job.objects.filter(name="digits-from-browser", owner=operator).count() == 1
    assert Node.objects.get(name="gpu-b").state == "DRAINING"
    assert AuditEntry.objects.filter(action="node.drain", actor=operator).count() == 1
