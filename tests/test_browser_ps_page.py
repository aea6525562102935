"""A parameter-server job's page in headless Chromium, seeded (no agents: fast).

Given a PS job in its second round whose processes reported every series the PS runtime has (32
of them: ``ps_*`` from each PS, ``worker_*`` from each worker, ``queue_*`` from the coordinator),
the page draws a few charts, not one per series: the training charts, and one chart per role
with a metric select and a process select. The workers' chart shares the training charts' cursor
and zoom (its steps are the workers' pushes). Progress reads in examples, the PS checkpoints are
listed, and the rounds table shows each allocation's processes by role. axe finds nothing serious.
Screenshots: artifacts/job-ps.png (the page), job-ps-roles.png, job-ps-rounds.png.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from console.cluster.models import Node
from console.core.states import RoundPhase
from console.jobs.models import Allocation, Checkpoint, Job, Round
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from tests.support.browser import ARTIFACTS, assert_accessible, chromium, log_in, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Where planning puts a 2-PS, 3-worker job on two nodes: (role, index, rank) by node.
LAYOUT = {
    "ps-a": [("coordinator", 0, 0), ("ps", 1, 2), ("worker", 1, 4)],
    "ps-b": [("ps", 0, 1), ("worker", 0, 3), ("worker", 2, 5)],
}
PUSHES = 600
EXAMPLES_DONE = 1_228_800


def seed(job: Job) -> None:
    rows: list[tuple[Any, ...]] = []
    seq = {rank: 0 for rank in range(6)}
    t = time.time()

    def add(rank: int, step: int, **values: float) -> None:
        seq[rank] += 1
        rows.extend((job.pk, 2, rank, seq[rank], step, name, float(v), t) for name, v in values.items())

    for push in range(10, PUSHES + 1, 10):
        add(3, push, loss=0.69 * 0.998**push + 0.1, auc=0.5 + 0.3 * (1 - 0.995**push))
        for rank, index in ((3, 0), (4, 1), (5, 2)):
            speed = 2000.0 + 300 * index
            add(
                rank,
                push,
                samples_per_s=speed,
                step_time_s=512 / speed,
                peak_memory_bytes=3.1e8 + index * 1e7,
            )
            add(
                rank,
                push,
                worker_examples_per_s=speed,
                worker_examples=push * 512.0,
                worker_staleness_mean=1.0 + index,
                worker_staleness_max=3.0 + index,
                worker_pull_p50_ms=1.2,
                worker_pull_p99_ms=4.0,
                worker_push_p50_ms=1.5,
                worker_push_p99_ms=5.0,
                worker_stale_retries=0,
                worker_duplicates=0,
            )
    for version in range(30, 3 * PUSHES + 1, 30):
        for rank, index in ((1, 0), (2, 1)):
            add(
                rank,
                version,
                ps_rows=200_000.0 * (index + 1) + version * 100,
                ps_bytes_held=6.4e7 + version * 1e4,
                ps_memory_bytes=4.2e8 + index * 5e7,
                ps_pulls_per_s=900.0 + index,
                ps_pushes_per_s=450.0 + 10 * index,
                ps_pull_p50_ms=0.9,
                ps_pull_p99_ms=3.1,
                ps_push_p50_ms=1.1,
                ps_push_p99_ms=3.9,
                ps_duplicates=0,
                ps_stale=0,
                ps_applied_batches=float(version),
            )
    for done in range(0, EXAMPLES_DONE + 1, 61_440):
        add(
            0,
            done,
            queue_epoch=0,
            queue_epochs=1,
            queue_shards_per_epoch=1500,
            queue_done=done // 2048,
            queue_in_progress=3,
            queue_todo=1500 - done // 2048 - 3,
            queue_examples_done=done,
            queue_examples_per_epoch=3_072_000,
            queue_workers=3,
            queue_requeued=2,
        )
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)


def make_ps_job(owner: User) -> Job:
    now = timezone.now()
    nodes = {
        name: Node.objects.create(
            name=name, address=f"10.0.1.{i + 1}", cpus=16, slots=3, last_heartbeat=now, state="ONLINE"
        )
        for i, name in enumerate(LAYOUT)
    }
    job = Job.objects.create(
        name="recsys-ps",
        workload="recsys-embedding",
        owner=owner,
        strategy="parameter_server",
        roles={"ps": {"count": 2, "mode": "async"}, "worker": {"count": 3, "min": 1, "max": 6}},
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        state="RUNNING",
        round_number=2,
        restarts=1,
        hyperparameters={"steps": 4000},
        progress={"step": EXAMPLES_DONE, "total": 3_072_000, "unit": "examples", "round": 2},
        started_at=now,
    )
    for number, reason in ((1, "start"), (2, "failure")):
        rnd = Round.objects.create(
            job=job,
            number=number,
            reason=reason,
            world_size=6,
            master_addr="10.0.1.1",
            master_port=29600 + number,
            state=RoundPhase.ENDED if number == 1 else RoundPhase.RUNNING,
            outcome="failed" if number == 1 else None,
            ended_at=now if number == 1 else None,
        )
        for node_rank, (name, processes) in enumerate(LAYOUT.items()):
            Allocation.objects.create(
                round=rnd,
                node=nodes[name],
                node_rank=node_rank,
                nproc=3,
                state=("FAILED" if name == "ps-b" else "STOPPED") if number == 1 else "RUNNING",
                processes=[{"role": r, "index": i, "rank": k} for r, i, k in processes],
            )
    for index, version in ((0, 1230), (1, 1228), (0, 1710), (1, 1712)):
        Checkpoint.objects.create(
            job=job,
            round_number=2,
            step=version,
            path=f"/data/checkpoints/job-{job.pk}/ps-{index:04d}-of-0002.pt",
            size_bytes=72 * 2**20,
            blocking_ms=31.0,
        )
    seed(job)
    return job


def legend(page: Any, chart: str) -> str:
    return str(page.locator(f'[data-chart="{chart}"] .chart-legend').text_content())


def test_a_ps_job_page_groups_its_role_series_into_a_chart_per_role(console_url: str) -> None:
    from playwright.sync_api import expect

    viewer = User.objects.create_user("victor", password="pw-viewer-1")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    job = make_ps_job(viewer)
    errors: list[str] = []
    with chromium() as browser:
        page = new_page(browser, errors)
        log_in(page, console_url, "victor", "pw-viewer-1")
        page.goto(f"{console_url}/jobs/{job.pk}/")

        # Then the training series have their charts and each role one chart: 32 role series
        # make no chart of their own
        for chart, text in [
            ("loss", "loss"),
            ("eval", "auc"),
            ("samples", "samples_per_s"),
            ("memory", "MiB"),
        ]:
            expect(page.locator(f'#charts [data-chart="{chart}"] .chart-legend')).to_contain_text(text)
        expect(page.locator("#role-charts .chart")).to_have_count(3)
        expect(page.locator('[data-chart^="other"]')).to_have_count(0)
        expect(page.locator('[data-chart="role-ps"] h3')).to_have_text("Parameter servers")
        # each role chart shows its default metric as a line per process
        for process in ("PS 0", "PS 1"):
            expect(page.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text(f"{process} 4")
        expect(page.locator("#role-ps-metric")).to_have_value("ps_pushes_per_s")
        for index in range(3):
            expect(page.locator('[data-chart="role-worker"] .chart-legend')).to_contain_text(
                f"worker {index} "
            )
        expect(page.locator('[data-chart="role-coordinator"] .chart-legend')).to_contain_text("queue")
        expect(page.locator('[data-chart="role-coordinator"] .role-x')).to_have_text("steps: examples done")
        page.wait_for_timeout(500)  # the page settles: its height is what a reader scrolls
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 4500, f"the PS job page is {height} px tall"

        # When the reader picks another metric, its series replace the others
        page.select_option("#role-ps-metric", "ps_rows")
        expect(page.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text("PS 0 380,000 @ 1800")
        expect(page.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text("PS 1 580,000 @ 1800")
        expect(page.locator('[data-chart="role-ps"] .chart-head')).to_contain_text("Rows held")
        # and one process
        page.select_option("#role-ps-process", "1")
        expect(page.locator('[data-chart="role-ps"] .legend-item')).to_have_count(1)
        expect(page.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text("PS 1 580,000")
        page.select_option("#role-worker-metric", "worker_staleness_max")
        expect(page.locator('[data-chart="role-worker"] .chart-legend')).to_contain_text("worker 2 5 @")

        # When the reader hovers the loss chart, the workers' chart shows the same step
        page.locator('[data-chart="loss"] .u-over').hover(position={"x": 200, "y": 60})
        at = re.search(r"@ (\d+)", legend(page, "loss"))
        assert at, legend(page, "loss")
        expect(page.locator('[data-chart="role-worker"] .chart-legend')).to_contain_text(f"@ {at.group(1)}")
        # and a drag across the workers' chart zooms the training charts too
        over = page.locator('[data-chart="role-worker"] .u-over')
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 50)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 50, steps=8)
        page.mouse.up()
        expect(page.locator("#zoom-state")).to_have_text(re.compile(r"^steps \d+\u2013\d+$"))

        # Progress counts the coordinator's examples, not anyone's steps
        expect(page.locator("#job-progress")).to_have_text("1,228,800/3,072,000 examples")
        expect(page.locator("#job-progress-bar")).to_have_attribute("style", re.compile("width: 40%"))
        # The PS checkpoints are listed, by version
        expect(page.locator("#checkpoints-table th").first).to_have_text("Version")
        expect(page.locator("#checkpoints-body tr")).to_have_count(4)
        expect(page.locator("#checkpoints-body tr").first).to_contain_text("ps-0001-of-0002.pt")
        expect(page.locator("#checkpoints-empty")).to_be_hidden()
        # The rounds table shows each allocation's processes by role
        current = page.locator("#rounds-body tr.current .allocs li")
        expect(current).to_have_count(2)
        expect(current.nth(0)).to_have_text(
            "ps-a node rank 0 · ranks 0, 2, 4 · CPU · coordinator, PS 1, worker 1 RUNNING"
        )
        expect(current.nth(1)).to_have_text(
            "ps-b node rank 1 · ranks 1, 3, 5 · CPU · PS 0, worker 0, worker 2 RUNNING"
        )

        page.mouse.move(0, 0)
        assert_accessible(page, "ps job page")
        page.locator("#role-charts").screenshot(path=str(ARTIFACTS / "job-ps-roles.png"))
        page.locator("#rounds-card").screenshot(path=str(ARTIFACTS / "job-ps-rounds.png"))
        shot(page, "job-ps")

        # And the dashboard and the jobs list say the same, with the unit
        for path in ("/", "/jobs/"):
            page.goto(f"{console_url}{path}")
            row = page.locator(f'#job-table tr[data-job-id="{job.pk}"] [data-field="progress"]')
            expect(row.locator(".progress-label")).to_have_text("1,228,800/3,072,000 examples")
            expect(row.locator(".progress-bar")).to_have_attribute("style", re.compile("width: 40%"))
        page.locator("#job-table").screenshot(path=str(ARTIFACTS / "jobs-ps.png"))

        # And in the light theme axe finds nothing serious either
        light = new_page(browser, errors, color_scheme="light")
        log_in(light, console_url, "victor", "pw-viewer-1")
        light.goto(f"{console_url}/jobs/{job.pk}/")
        expect(light.locator('[data-chart="role-ps"] .chart-legend')).to_contain_text("PS 1 ")
        assert_accessible(light, "ps job page (light)")
    assert errors == []
