"""The console's pages in headless Chromium, on a seeded cluster (no agents: fast).

Given a job with two rounds (the first failed on rank 1), every kind of metric the SDK and the
workloads emit, four ranks (one a straggler), logs, checkpoints and a pending queue, an operator
walks every page: charts, ranks, the highlighted root cause and its log lines, log filters,
zoom, the node page with drain, the submit form's field errors and an archive upload, the API
docs; the websocket is dropped and comes back on its own; without websockets the page polls,
logs included; a viewer finds no controls. axe-core runs on every page, in both themes.
Screenshots land in artifacts/ (docs/ holds the README's copies of the job and node pages).

The end-to-end walk with real agents is tests/test_browser_live.py.
"""

from __future__ import annotations

import io
import re
import threading
import time
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections, transaction
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core.models import AuditEntry
from console.jobs.models import Allocation, Checkpoint, Job, Round, RoundPhase
from console.telemetry.events import emit
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from console.telemetry.models import LogLine, Severity
from tests.support.browser import assert_accessible, chromium, log_in, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STEPS = 400
ROUND_2_FROM = 201
ERROR_TEXT = "RuntimeError: CUDA error: an illegal memory access was encountered (step 200)"


def seed_metrics(job: Job) -> None:
    """Every signal the SDK (step timer, watcher, progress) and the workloads (loss, eval, lr)
    record, for 4 ranks over two rounds; rank 3 is twice as slow."""
    rows: list[tuple[Any, ...]] = []
    t = time.time()
    seq = 0

    def add(rank: int, step: int, name: str, value: float) -> None:
        nonlocal seq
        seq += 1
        rows.append((job.pk, 1 if step < ROUND_2_FROM else 2, rank, seq, step, name, float(value), t))

    add(0, 0, "total_steps", 1000)
    for step in range(1, STEPS + 1):
        loss = 3.0 * 0.993**step + 0.2 + (0.8 if step == 150 else 0.0)
        add(0, step, "loss", loss)
        add(0, step, "lr", 3e-3 * min(1.0, step / 50))
        if step % 20 == 0:
            add(0, step, "val_loss", loss * 1.1)
            add(0, step, "perplexity", 2.718 ** (loss * 1.1))
        if step % 5 == 0:
            add(0, step, "grad_norm", 1.5 * 0.995**step + 0.1)
            add(0, step, "grad_norm/0", 1.0 * 0.995**step)
            add(0, step, "grad_norm/2", 0.5 * 0.995**step)
            add(0, step, "param_norm", 12.0 + step / 100)
            add(0, step, "update_ratio", 1e-3 * 0.99 ** (step / 5))
        if step % 10 == 0:
            for rank in range(4):
                step_time = 0.05 * (2.0 if rank == 3 else 1.0) * (1 + 0.05 * (step % 30) / 30)
                add(rank, step, "step_time_s", step_time)
                add(rank, step, "samples_per_s", 32 / step_time)
                add(rank, step, "tokens_per_s", 32 * 128 / step_time)
                add(rank, step, "peak_memory_bytes", 1.5 * 2**30 + rank * 2**26)
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)


def seed_logs(job: Job) -> None:
    now = datetime.now(UTC)
    lines = []
    for rnd, steps in ((1, range(0, 200, 10)), (2, range(200, 400, 10))):
        for rank in range(4):
            for seq, step in enumerate(steps):
                lines.append(
                    (rnd, rank, "stdout", seq, f"rank {rank}: step {step} loss {3.0 * 0.993**step:.4f}")
                )
    for i, text in enumerate(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 88, in <module>',
            "    loss.backward()",
            ERROR_TEXT,
        ]
    ):
        lines.append((1, 1, "stderr", 100 + i, text))
    LogLine.objects.bulk_create(
        LogLine(job=job, round_number=r, rank=k, stream=s, seq=q, text=x, time=now) for r, k, s, q, x in lines
    )


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
            Gpu.objects.create(
                node=node,
                index=g,
                name="NVIDIA A100-SXM4-80GB",
                utilization=80.0 - 10 * g,
                memory_bytes=80 * 2**30,
                memory_used_bytes=(20 + 10 * g) * 2**30,
            )
        nodes.append(node)
    for i, state in enumerate(["SUCCEEDED", "FAILED", "STOPPED"]):
        Job.objects.create(name=f"sweep-{i}", workload="digits", owner=owner, state=state)
    Job.objects.create(
        name="big-pretrain",
        workload="tiny-lm",
        owner=owner,
        min_nodes=3,
        max_nodes=3,
        desired_nodes=3,
        nproc_per_node=4,
        gpus_per_proc=1,
        priority=5,
    )
    small = Job.objects.create(name="small-eval", workload="digits", owner=owner)
    # A chart of a single point (what a job's first live frame draws) and a flat one
    with transaction.atomic():
        store_metrics(
            MetricBatch.of(
                [
                    (small.pk, 1, 0, 1, 7, "loss", 0.5, time.time()),
                    (small.pk, 1, 0, 2, 7, "lr", 0.1, time.time()),
                ]
            ),
            replay=False,
        )
    job = Job.objects.create(
        name="tiny-lm-elastic",
        workload="tiny-lm",
        owner=owner,
        min_nodes=1,
        max_nodes=3,
        desired_nodes=2,
        nproc_per_node=2,
        gpus_per_proc=1,
        state="RUNNING",
        round_number=2,
        restarts=1,
        progress={"step": STEPS, "total": 1000, "unit": "steps", "round": 2},
        hyperparameters={"lr": 0.003, "batch_size": 16},
        started_at=now,
    )
    cause = {
        "round": 1,
        "node": "gpu-a",
        "rank": 1,
        "local_rank": 1,
        "exit_code": 1,
        "signal": None,
        "error": "Traceback (most recent call last):\n  ...\n" + ERROR_TEXT,
    }
    for number, reason in [(1, "start"), (2, "failure")]:
        rnd = Round.objects.create(
            job=job,
            number=number,
            reason=reason,
            world_size=4,
            master_addr="10.0.0.1",
            master_port=29500 + number,
            state=RoundPhase.ENDED if number == 1 else RoundPhase.FORMING,
            outcome="failed" if number == 1 else None,
            ended_at=now if number == 1 else None,
            failure=cause if number == 1 else {},
            failed_at=now if number == 1 else None,
            # round 2 recovered in place: three survivors carried over, formed 0.94 s later
            inplace=number == 2,
            carry_over={"from_round": 1, "ranks": {"0": 0, "2": 2, "3": 3}} if number == 2 else {},
        )
        if number == 2:
            rnd.save(
                update_fields=rnd.set_state(RoundPhase.RUNNING, at=rnd.created_at + timedelta(seconds=0.94))
            )
        for node_rank, node in enumerate(nodes[:2]):
            exits = (
                [{"rank": 1, "local_rank": 1, "exit_code": 1, "signal": None}]
                if number == 1 and node_rank == 0
                else []
            )
            Allocation.objects.create(
                round=rnd,
                node=node,
                node_rank=node_rank,
                nproc=2,
                gpu_indices=[0, 1],
                state=("FAILED" if node_rank == 0 else "STOPPED") if number == 1 else "RUNNING",
                exit_info={"exits": exits},
            )
    emit("job.submitted", "Submitted by olivia", job=job)
    emit("round.started", "Round 1 started on gpu-a, gpu-b (world 4)", job=job)
    emit(
        "rank.failed",
        "Rank 1 on gpu-a failed with exit code 1",
        job=job,
        severity=Severity.ERROR,
        cause=cause,
    )
    emit("round.started", "Round 2 started on gpu-a, gpu-b (world 4)", job=job)
    emit("anomaly.loss_spike", "Loss jumped 3.1x at step 150", job=job, severity=Severity.WARNING)
    for step in (100, 200, 300):
        Checkpoint.objects.create(
            job=job,
            round_number=1 if step < ROUND_2_FROM else 2,
            step=step,
            path=f"/ckpt/job-{job.pk}/step-{step}.pt",
            size_bytes=48 * 2**20 + step,
            blocking_ms=12.5,
        )
    seed_metrics(job)
    seed_logs(job)
    return job


def in_thread(call: Any) -> None:
    """The ORM refuses to run in the thread where Playwright's sync API has its event loop."""

    def run() -> None:
        try:
            call()
        finally:
            connections.close_all()  # this thread's own connection, or the test database stays in use

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()


def code_archive(tmp_path: Path) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("train.py", "print('hello from the bundle')\n")
    path = tmp_path / "code.zip"
    path.write_bytes(buffer.getvalue())
    return path


def test_operator_and_viewer_use_every_page(console_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    operator = User.objects.create_user("olivia", password="pw-operator-1")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    User.objects.create_user("victor", password="pw-viewer-1").groups.add(
        Group.objects.get_or_create(name="viewer")[0]
    )
    job = make_cluster(operator)
    small_id = Job.objects.get(name="small-eval").pk
    archive = code_archive(tmp_path)
    errors: list[str] = []
    late_line = LogLine(
        job=job,
        round_number=2,
        rank=2,
        stream="stdout",
        seq=999,
        text="rank 2: a line written while the page polls",
        time=datetime.now(UTC),
    )

    started = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}")

    with chromium() as browser:
        page = new_page(browser, errors)
        # Given the operator signed in: the dashboard shows the queue in placement order
        log_in(page, console_url, "olivia", "pw-operator-1")
        queue = page.locator("#queue-table tbody tr")
        expect(queue).to_have_count(2)
        expect(queue.nth(0)).to_contain_text("big-pretrain")
        expect(queue.nth(0).locator(".why")).to_contain_text("Needs 3 node(s) with 4 free GPU(s) each")
        expect(queue.nth(1)).to_contain_text("waits behind #")
        expect(page.locator("#live-status")).to_have_text("live", timeout=15000)
        assert_accessible(page, "dashboard")
        shot(page, "dashboard")

        mark("When the operator opens the ")
        # When the operator opens the job, every signal has a chart with its latest value
        page.goto(f"{console_url}/jobs/{job.pk}/")
        for chart, text in [
            ("loss", "val_loss"),
            ("grad", "grad_norm"),
            ("samples", "samples_per_s"),
            ("tokens", "tokens_per_s"),
            ("lr", "lr"),
            ("memory", "GiB"),
            ("eval", "perplexity"),
            ("params", "param_norm"),
            ("update", "update_ratio"),
            ("steptime", "straggler"),
        ]:
            expect(page.locator(f'[data-chart="{chart}"] .chart-legend')).to_contain_text(text, timeout=15000)
            expect(page.locator(f'[data-chart="{chart}"] canvas')).to_have_count(1)
        expect(page.locator('[data-chart="loss"] .chart-head h3')).to_have_text("Loss")
        expect(page.locator("#round-boundaries")).to_contain_text(
            f"round 2 (failure, world 4) from step {ROUND_2_FROM}"
        )
        # the rounds table marks the in-place round and how long its change took
        newest = page.locator("#rounds-body tr").first
        expect(newest.locator("td").nth(1).locator(".badge")).to_have_text("in place")
        expect(newest).to_contain_text("0.94 s")
        expect(page.locator("#rounds-body tr").nth(1).locator("td").nth(1).locator(".badge")).to_have_count(0)
        # each allocation on a line of its own: node, node rank, global ranks, GPUs, state
        lines = newest.locator(".allocs li")
        expect(lines).to_have_count(2)
        expect(lines.nth(0)).to_have_text("gpu-a node rank 0 · ranks 0\u20131 · GPU 0, 1 RUNNING")
        expect(lines.nth(1)).to_have_text("gpu-b node rank 1 · ranks 2\u20133 · GPU 0, 1 RUNNING")
        expect(lines.nth(0).locator("a")).to_have_attribute("href", "/nodes/gpu-a/")
        expect(page.locator("#rounds-body tr").nth(1).locator(".allocs li").nth(0)).to_contain_text("FAILED")
        # progress from the script's own total (sdk.progress → total_steps), with an ETA
        expect(page.locator("#job-progress")).to_have_text(f"{STEPS}/1,000 steps")
        expect(page.locator("#job-eta")).to_contain_text("ETA")
        # ranks: one row each, the slow one marked
        expect(page.locator("#ranks-body tr")).to_have_count(4)
        expect(page.locator('#ranks-body tr[data-rank="3"]')).to_contain_text("straggler")
        expect(page.locator('#ranks-body tr[data-rank="0"] .node a')).to_have_text("gpu-a")
        expect(page.locator("#checkpoints-body tr")).to_have_count(3)
        expect(page.locator("#checkpoints-body tr").first).to_contain_text("300")
        # the periodic refresh (every 5 s) leaves unchanged rows alone: the same elements stay
        page.evaluate(
            "() => { for (const tr of document.querySelectorAll('#ranks-body tr, #checkpoints-body tr')) tr.__kept = true; }"
        )
        with page.expect_response(re.compile(r"/checkpoints/"), timeout=10000):
            pass
        page.wait_for_timeout(300)
        kept = "() => [...document.querySelectorAll('#ranks-body tr, #checkpoints-body tr')].filter((tr) => tr.__kept).length"
        assert page.evaluate(kept) == 7
        # per-layer gradient norms on demand
        page.check("#layers-toggle")
        expect(page.locator('[data-chart="layers"] .chart-legend')).to_contain_text("2", timeout=10000)
        # hovering one chart shows the same step's values on every chart
        box = page.locator('[data-chart="loss"] .u-over').bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        hovered = page.locator('[data-chart="loss"] .legend-item').first.text_content() or ""
        step_hovered = hovered.rsplit("@ ", 1)[1]
        assert int(step_hovered) < STEPS
        expect(page.locator('[data-chart="lr"] .legend-item').first).to_contain_text(f"@ {step_hovered}")
        # zoom from the keyboard-usable form, on all charts at once
        page.fill("#zoom-from", "100")
        page.fill("#zoom-to", "250")
        page.click('#zoom-form button[type="submit"]')
        expect(page.locator("#zoom-state")).to_have_text("steps 100\u2013250")
        zoomed = page.evaluate("() => [...document.querySelectorAll('.chart .u-over')].length")
        assert zoomed >= 10
        shot(page, "job")
        assert_accessible(page, "job page (dark)")

        mark("The root-cause event")
        # The root-cause event is highlighted and opens rank 1's log at the failing lines
        cause = page.locator("#events .root-cause")
        expect(cause).to_have_count(1)
        expect(cause).to_contain_text("root cause")
        cause.locator(".root-cause-link").click()
        expect(page.locator("#log-rank")).to_have_value("1")
        failing = page.locator("#log-viewport .log-line.failing")
        expect(failing.last).to_contain_text(ERROR_TEXT)
        expect(failing.first).to_be_in_viewport()
        expect(page.locator("#log-follow")).to_have_attribute("aria-pressed", "false")
        # logs by rank and search
        page.select_option("#log-rank", "2")
        page.fill("#log-search", "step 37")
        rows = page.locator("#log-viewport .log-line")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("rank 2: step 370")
        expect(page.locator("#log-status")).to_contain_text("1 of")
        expect(page.locator("#log-status")).to_contain_text("0 dropped")
        with page.expect_download() as download:
            page.click("#log-download")
        assert "rank 2: step 370" in Path(download.value.path()).read_text()
        # event filters
        page.select_option("#event-severity", "error")
        expect(page.locator("#events li.event:visible")).to_have_count(1)
        page.select_option("#event-severity", "")

        mark("The same page in the light t")
        # The same page in the light theme
        light = new_page(browser, errors, color_scheme="light")
        log_in(light, console_url, "olivia", "pw-operator-1")
        light.goto(f"{console_url}/jobs/{job.pk}/")
        expect(light.locator('[data-chart="loss"] canvas')).to_have_count(1, timeout=15000)
        expect(light.locator('[data-chart="steptime"] .chart-legend')).to_contain_text(
            "straggler", timeout=15000
        )
        assert_accessible(light, "job page (light)")
        shot(light, "job-light")
        light.context.close()

        mark("When the websocket drops")
        # When the websocket drops, the tab reconnects by itself and keeps its charts
        sockets: list[Any] = []

        def relay(ws: Any) -> None:
            ws.connect_to_server()
            sockets.append(ws)

        page.route_web_socket(re.compile(r".*/ws/jobs/.*"), relay)
        page.reload()
        expect(page.locator("#live-status")).to_have_text("live", timeout=15000)
        expect(page.locator('[data-chart="loss"] canvas')).to_have_count(1, timeout=15000)
        sockets[-1].close(code=1001, reason="network went away")
        expect(page.locator("#live-status")).to_have_attribute(
            "data-state", re.compile("reconnecting|polling")
        )
        expect(page.locator("#live-status")).to_have_text("live", timeout=20000)
        assert len(sockets) == 2
        expect(page.locator('[data-chart="loss"] canvas')).to_have_count(1)
        expect(page.locator("#live-status")).to_have_attribute("role", "status")

        mark("The node page")
        # The node page: GPUs with utilisation and memory, what it holds; drain with confirmation
        page.locator('#ranks-body tr[data-rank="2"] .node a').click()
        expect(page.locator("h1")).to_contain_text("gpu-b")
        expect(page.locator("#gpu-table tbody tr")).to_have_count(4)
        expect(page.locator('#gpu-table tr[data-gpu="1"]')).to_contain_text("70%")
        expect(page.locator("#holding-table")).to_contain_text("tiny-lm-elastic")
        expect(page.locator("#node-history")).to_contain_text("failed")
        expect(page.locator("#node-heartbeat")).to_contain_text("ago")
        assert_accessible(page, "node page")
        shot(page, "node")
        page.once("dialog", lambda dialog: dialog.dismiss())
        page.click("#drain-button")
        expect(page.locator("#node-state")).to_have_text("ONLINE")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#drain-button")
        expect(page.locator("#node-state")).to_have_text("DRAINING", timeout=10000)
        expect(page.locator("#undrain-button")).to_be_visible()

        mark("The submit form")
        # The submit form: an archive uploaded with a progress bar, then the API's field errors
        page.click("nav >> text=Submit job")
        page.set_input_files("#f-archive", str(archive))
        expect(page.locator("#upload-status")).to_contain_text("as bundle #", timeout=15000)
        expect(page.locator("#upload-progress")).to_have_attribute("value", "100")
        assert page.locator("#f-bundle").input_value() != ""
        page.fill("#f-name", "bad name!")
        page.fill("#f-nnodes", "3:2")
        page.fill("#f-entrypoint", "train.py")
        page.fill("#f-env", "RANK=3")
        page.fill("#f-grace", "-1")
        page.click("#submit-button")
        for field in ("name", "nnodes", "env", "grace_period"):
            expect(page.locator(f'.field-error[data-for="{field}"]')).not_to_be_empty()
        expect(page.locator('.field-error[data-for="env"]')).to_contain_text("set by the launcher")
        page.click("#add-secret")
        page.fill('[aria-label="Secret 1 value"]', "a value without a name")
        page.click("#submit-button")
        expect(page.locator('.field-error[data-for="secret_env"]')).to_contain_text("give it a name")
        assert_accessible(page, "submit form")
        shot(page, "submit")

        mark("The API docs")
        # The API docs: ReDoc served by the console, behind the login
        page.click("nav >> text=API schema")
        expect(page.locator("#api-reference")).to_contain_text("Trainyard API", timeout=60000)
        expect(page.locator("#api-reference")).to_contain_text("/api/v1/jobs/")
        assert_accessible(page, "API docs")
        shot(page, "api-docs")

        mark("Without websockets")
        # Without websockets the job page polls, and still gets new log lines and events
        offline = new_page(browser, errors)
        log_in(offline, console_url, "olivia", "pw-operator-1")
        offline.route_web_socket(re.compile(r".*/ws/.*"), lambda ws: ws.close())
        offline.goto(f"{console_url}/jobs/{job.pk}/")
        expect(offline.locator("#live-status")).to_have_attribute("data-state", "polling", timeout=15000)
        expect(offline.locator('[data-chart="loss"] canvas')).to_have_count(1, timeout=15000)
        offline.fill("#log-search", "while the page polls")
        expect(offline.locator("#log-viewport .log-line")).to_have_count(0)
        in_thread(late_line.save)
        expect(offline.locator("#log-viewport .log-line")).to_have_count(1, timeout=15000)
        offline.context.close()

        mark("A viewer sees")
        # A viewer sees everything and can change nothing
        viewer = new_page(browser, errors)
        log_in(viewer, console_url, "victor", "pw-viewer-1")
        expect(viewer.locator("nav")).not_to_contain_text("Submit job")
        assert_accessible(viewer, "dashboard (viewer)")
        viewer.goto(f"{console_url}/jobs/{job.pk}/")
        expect(viewer.locator('[data-chart="loss"] canvas')).to_have_count(1, timeout=15000)
        for control in ("#job-actions", "#stop-button", "#restart-button", "#resize-form"):
            expect(viewer.locator(control)).to_have_count(0)
        viewer.goto(f"{console_url}/jobs/{small_id}/")
        expect(viewer.locator('[data-chart="loss"] .chart-legend')).to_contain_text("loss 0.5 @ 7")
        expect(viewer.locator('[data-chart="lr"] canvas')).to_have_count(1)
        viewer.goto(f"{console_url}/nodes/gpu-a/")
        expect(viewer.locator("[data-node-action]")).to_have_count(0)
        viewer.goto(f"{console_url}/nodes/")
        expect(viewer.locator("[data-node-action]")).to_have_count(0)
        assert_accessible(viewer, "nodes (viewer)")
        # The jobs list: filter by name prefix and owner, then sort by a column header
        viewer.goto(f"{console_url}/jobs/")
        viewer.fill("#jobs-name", "sweep")
        viewer.fill("#jobs-owner", "olivia")
        viewer.click("#job-filters button[type=submit]")
        rows = viewer.locator("#job-table tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.nth(0)).to_contain_text("sweep-2")  # newest first by default
        viewer.click('[data-sort-column="name"]')
        expect(viewer.locator("th[aria-sort]")).to_have_attribute("aria-sort", "ascending")
        expect(rows.nth(0)).to_contain_text("sweep-0")
        expect(viewer.locator("#jobs-name")).to_have_value("sweep")  # the filters stay
        viewer.select_option("#jobs-state", "FAILED")
        viewer.click("#job-filters button[type=submit]")
        expect(rows).to_have_count(1)
        expect(rows.nth(0)).to_contain_text("sweep-1")
        assert_accessible(viewer, "jobs (viewer)")
        shot(viewer, "jobs")
        response = viewer.goto(f"{console_url}/jobs/new/")
        assert response is not None and response.status == 403

        mark("The login page too")
        # The login page too
        anonymous = new_page(browser, errors)
        anonymous.goto(console_url + "/api-docs/")
        expect(anonymous).to_have_url(re.compile(r"/accounts/login/\?next=/api-docs/"))
        assert_accessible(anonymous, "login")

    # Playwright's sync API runs an event loop in this thread, so the ORM waits until it is gone.
    assert errors == []
    assert Node.objects.get(name="gpu-b").state == "DRAINING"
    assert AuditEntry.objects.filter(action="node.drain", actor=operator).count() == 1
