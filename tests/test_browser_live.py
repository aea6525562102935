"""An operator drives a live console in headless Chromium: a real Daphne, controller, ingest and
three real agents running a DDP script that uses the SDK.

Given the console and two agents, the operator uploads a folder from the submit form (a bad
spec first: the API's field errors show) and submits it on 2 nodes; loss, gradient-norm and
throughput points arrive; a third agent joins and the operator resizes to 3: the round boundary
and world size 3 show; a rank is SIGKILLed: the highlighted root cause leads to that rank's log
lines; logs are filtered by rank and searched; checkpoints are listed; the node page shows the
round it holds; a viewer finds no controls; the operator stops the job.
"""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import Group, User
from django.db import connections

from console.jobs.models import Job
from tests.support.browser import chromium, log_in, new_page, shot
from tests.support.controller import REPO
from tests.support.live import LiveConsole

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

CODE = REPO / "tests" / "scripts" / "sdk_job"


def rank_process(live: LiveConsole, job_id: int, node_rank: int) -> psutil.Process:
    """The training process on the node at ``node_rank`` of the job's current round (one
    process per node here, so its global rank is ``node_rank``)."""
    from console.jobs.models import Allocation

    job = Job.objects.get(pk=job_id)
    node = Allocation.objects.get(round__job=job, round__number=job.round_number, node_rank=node_rank).node
    agent = live.agents.agents[[a.name for a in live.agents.agents].index(node.name)]
    for proc in agent.descendants():
        try:
            # The runner retitles a rank as "python train.py ARGS" (one string, setproctitle).
            if "train.py" in " ".join(proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no training process on {node.name}")


def in_thread(call: Any) -> Any:
    """ORM calls cannot run in the thread where Playwright's sync API has its event loop."""
    import threading

    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            failure.append(exc)
        finally:
            connections.close_all()  # this thread's own connection, or the test database stays in use

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


def walk(browser: Any, page: Any, live_console: LiveConsole, errors: list[str], mark: Any) -> int:
    """The operator's steps; returns the job's id."""
    from playwright.sync_api import expect

    base = live_console.url
    log_in(page, base, "olivia", "pw-operator-1")

    # Given the submit form: a folder uploaded from the browser becomes a bundle
    page.click("nav >> text=Submit job")
    page.select_option("#f-workload", "")
    page.set_input_files("#f-folder", str(CODE))
    expect(page.locator("#upload-status")).to_contain_text("as bundle #")
    # A spec the API refuses shows its field errors and submits nothing
    page.fill("#f-name", "sdk ddp!")
    page.fill("#f-entrypoint", "train.py")
    page.fill("#f-args", "--steps\n100000\n--sleep\n0.1")
    page.fill("#f-nnodes", "2:3")
    page.fill("#f-restarts", "3")
    page.fill("#f-grace", "10")
    page.fill("#f-env", "TRAINYARD_DEMO=1")
    # A secret typed into a password field: the job holds it, no page shows it again
    page.click("#add-secret")
    page.fill('[aria-label="Secret 1 name"]', "DEMO_TOKEN")
    page.fill('[aria-label="Secret 1 value"]', "s3cr3t-from-the-form")
    assert page.get_attribute('[aria-label="Secret 1 value"]', "type") == "password"
    page.click("#submit-button")
    expect(page.locator('.field-error[data-for="name"]')).to_contain_text("letters, digits")
    # When it is fixed and submitted on 2 nodes
    page.fill("#f-name", "sdk-ddp")
    page.click("#submit-button")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert in_thread(lambda: Job.objects.get(pk=job_id).secret_env) == {"DEMO_TOKEN": "s3cr3t-from-the-form"}
    mark("submitted")

    # Then the job runs at world size 2 and loss, grad-norm and throughput points arrive live
    expect(page.locator("#job-state")).to_have_text("RUNNING", timeout=180000)
    assert "s3cr3t-from-the-form" not in page.content()
    expect(page.locator("#world-size")).to_have_text("2", timeout=30000)
    for chart, name in [("loss", "loss"), ("grad", "grad_norm"), ("samples", "samples_per_s")]:
        expect(page.locator(f'[data-chart="{chart}"] .chart-legend')).to_contain_text(
            f"{name} ", timeout=150000
        )
    legend = page.locator('[data-chart="loss"] .legend-item').first
    first_step = int((legend.text_content() or "").rsplit("@ ", 1)[1])
    expect(legend).not_to_contain_text(f"@ {first_step}", timeout=20000)  # newer points keep coming
    expect(page.locator("#job-progress")).to_have_text(re.compile(r"^[\d,]+/100,000 steps$"))
    expect(page.locator("#ranks-body tr")).to_have_count(2)
    mark("live points")

    # When the operator pins it at 2, a third node joins, and the operator resizes to 3
    page.fill("#resize-nodes", "2")
    page.click('#resize-form button[type="submit"]')
    expect(page.locator("#action-message")).to_have_text("Resize accepted.")
    in_thread(lambda: live_console.start_agents("n3"))
    page.fill("#resize-nodes", "3")
    page.click('#resize-form button[type="submit"]')
    expect(page.locator("#action-message")).to_have_text("Resize accepted.")
    # Then a round boundary marks the resize on every chart and the world size is 3
    expect(page.locator("#world-size")).to_have_text("3", timeout=90000)
    expect(page.locator("#round-boundaries")).to_contain_text("(resize, world 3)", timeout=60000)
    expect(page.locator("#ranks-body tr")).to_have_count(3)
    boundary = re.search(r"from step (\d+)", page.locator("#round-boundaries").text_content() or "")
    assert boundary is not None
    expect(page.locator('[data-chart="loss"] .legend-item').first).to_contain_text(
        re.compile(r"@ \d+"), timeout=30000
    )
    shot(page, "live-job-resized")
    mark("resized")

    # When rank 1 is killed, the job restarts and the root cause is highlighted
    victim = in_thread(lambda: rank_process(live_console, job_id, 1))
    victim.send_signal(signal.SIGKILL)
    cause = page.locator("#events .root-cause")
    expect(cause).to_have_count(1, timeout=60000)
    expect(cause).to_contain_text("Rank 1")
    expect(cause).to_contain_text("SIGKILL")
    expect(page.locator("#round-boundaries")).to_contain_text("(failure, world 3)", timeout=90000)
    # and its link opens rank 1's log at the lines where it stopped
    cause.locator(".root-cause-link").click()
    expect(page.locator("#log-rank")).to_have_value("1")
    failing = page.locator("#log-viewport .log-line.failing")
    expect(failing.first).to_be_visible()
    ranks_shown = page.locator("#log-viewport .log-line .log-rank").all_text_contents()
    assert ranks_shown and set(ranks_shown) == {"r1"}
    mark("root cause")

    # Logs filtered by rank and searched
    page.select_option("#log-rank", "2")
    page.fill("#log-search", "resumed from step")
    # (it resumed in the resize round and again after the failure)
    expect(page.locator("#log-viewport .log-line")).to_have_count(2, timeout=30000)
    expect(page.locator("#log-viewport .log-line").first).to_contain_text("rank 2: resumed from step")
    expect(page.locator("#log-status")).to_contain_text("dropped from the live tail")
    # The checkpoint list has the SDK's saves
    expect(page.locator("#checkpoints-body tr").first).to_be_visible(timeout=20000)
    shot(page, "live-job")

    # The node page shows the round this node holds
    page.locator('#ranks-body tr[data-rank="2"] .node a').click()
    expect(page.locator("#holding-table")).to_contain_text("sdk-ddp")
    expect(page.locator("#node-heartbeat")).to_contain_text("ago")
    shot(page, "live-node")
    mark("node page")

    # A viewer finds no controls
    viewer = new_page(browser, errors)
    log_in(viewer, base, "victor", "pw-viewer-1")
    viewer.goto(f"{base}/jobs/{job_id}/")
    expect(viewer.locator('[data-chart="loss"] canvas')).to_have_count(1, timeout=20000)
    expect(viewer.locator("#job-actions")).to_have_count(0)
    expect(viewer.locator("#stop-button")).to_have_count(0)
    viewer.context.close()

    # When the operator stops the job, it ends STOPPED
    page.go_back()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-button")
    expect(page.locator("#action-message")).to_have_text("Stop accepted.")
    expect(page.locator("#job-state")).to_have_text("STOPPED", timeout=60000)
    mark("stopped")

    return job_id


def test_operator_runs_resizes_breaks_and_stops_a_job_in_the_browser(live_console: LiveConsole) -> None:
    operator = User.objects.create_user("olivia", password="pw-operator-1")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    User.objects.create_user("victor", password="pw-viewer-1").groups.add(
        Group.objects.get_or_create(name="viewer")[0]
    )
    live_console.start_agents("n1", "n2")
    errors: list[str] = []
    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}", flush=True)

    with chromium() as browser:
        page = new_page(browser, errors)
        page.set_default_timeout(20000)
        try:
            job_id = walk(browser, page, live_console, errors, mark)
        except AssertionError:
            print("events seen by the page:\n" + page.locator("#events").inner_text(), flush=True)
            print(f"page errors: {errors}", flush=True)
            raise

    assert errors == []
    job = Job.objects.get(pk=job_id)
    assert job.state == "STOPPED"
    assert job.bundle is not None and job.bundle.filename == "sdk_job.zip"
    assert job.env == {"TRAINYARD_DEMO": "1"}
    assert job.grace_period == 10
