"""A hung job's page in headless Chromium, seeded (no agents: fast; tests/test_job_hang_e2e.py
makes a real hang).

Given a 3-rank job whose round hung (ranks 0-1 waiting in all_reduce at train.py:41, rank 2 in the
data loader at train.py:38, frozen) and whose agents sampled its ranks' CPU and memory, the job
page shows the Hang card: the summary naming rank 2, the ranks grouped by identical stack, and a
group's stack (innermost first) with every rank's node, state and step when opened; the resource
charts are drawn. axe finds nothing serious. Screenshots: artifacts/job-hang.png (the page),
job-hang-card.png (the card, a group opened).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from console.cluster.models import Node
from console.core.states import RoundPhase
from console.jobs import hangs
from console.jobs.hang_models import Hang, RankStack
from console.jobs.models import Allocation, Job, Round
from console.telemetry.ingest.storage import MetricBatch, store_metrics
from tests.support.browser import ARTIFACTS, assert_accessible, chromium, log_in, new_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ALLREDUCE = [
    {"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 3252},
    {"name": "wrapper", "file": "torch/distributed/c10d_logger.py", "line": 83},
    {"name": "train", "file": "train.py", "line": 41},
    {"name": "<module>", "file": "train.py", "line": 60},
]
LOADER = [
    {"name": "__next__", "file": "torch/utils/data/dataloader.py", "line": 733},
    {"name": "train", "file": "train.py", "line": 38},
    {"name": "<module>", "file": "train.py", "line": 60},
]


def make_hung_job(owner: User) -> Job:
    now = timezone.now()
    nodes = [
        Node.objects.create(
            name=name, address=f"10.0.2.{i}", cpus=8, slots=2, last_heartbeat=now, state="ONLINE"
        )
        for i, name in enumerate(("gpu-a", "gpu-b"), start=1)
    ]
    job = Job.objects.create(
        name="stuck-ddp",
        entrypoint="train.py",
        workdir="/srv/code",
        owner=owner,
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        nproc_per_node=2,
        state="RUNNING",
        round_number=1,
        hang_policy={"timeout_s": 120, "action": "notify"},
        progress={"step": 40, "total": 1000, "round": 1},
        started_at=now,
    )
    rnd = Round.objects.create(
        job=job,
        number=1,
        reason="start",
        world_size=4,
        master_addr="10.0.2.1",
        master_port=29500,
        state=RoundPhase.RUNNING,
    )
    for node_rank, node in enumerate(nodes):
        Allocation.objects.create(round=rnd, node=node, node_rank=node_rank, nproc=2, state="RUNNING")
    hang = Hang.objects.create(
        job=job, round_number=1, reason="stall", threshold_s=120.0, stalled=[0, 1, 2, 3], detected_at=now
    )
    for rank, (host, frames, state) in enumerate(
        [
            ("gpu-a", ALLREDUCE, "sleeping"),
            ("gpu-a", ALLREDUCE, "sleeping"),
            ("gpu-b", LOADER, "stopped"),
            ("gpu-b", ALLREDUCE, "sleeping"),
        ]
    ):
        RankStack.objects.create(
            hang=hang,
            node_name=host,
            rank=rank,
            local_rank=rank % 2,
            pid=4000 + rank,
            process_state=state,
            step=40,
            stalled_s=121.5,
            threads=[{"name": "MainThread", "idle": True, "frames": frames}],
            collected_at=now,
        )
    with transaction.atomic():
        hangs.conclude(Job.lock(job.pk), Hang.objects.select_for_update().get(pk=hang.pk))
    rows: list[tuple[Any, ...]] = []
    t = time.time()
    for rank in range(4):
        for second in range(1, 60):
            rows += [
                (job.pk, 1, rank, second, second, "res_cpu_percent", 95.0 if second < 40 else 0.4, t),
                (job.pk, 1, rank, second, second, "res_memory_bytes", 6.1e8 + rank * 1e7, t),
            ]
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
    return job


def test_the_job_page_shows_the_hang_with_ranks_grouped_by_stack(console_url: str) -> None:
    from playwright.sync_api import expect

    viewer = User.objects.create_user("vera", password="pw-viewer-1")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    job = make_hung_job(viewer)
    errors: list[str] = []
    with chromium() as browser:
        page = new_page(browser, errors)
        log_in(page, console_url, "vera", "pw-viewer-1")
        page.goto(f"{console_url}/jobs/{job.pk}/")

        # Then the Hang card names the frozen rank and groups the ranks by stack
        card = page.locator("#hangs-card")
        expect(card).to_be_visible()
        expect(page.locator("#hang-summary")).to_contain_text("Rank 2: process stopped")
        groups = page.locator("#hang-groups > li summary")
        expect(groups).to_have_count(2)
        expect(groups.nth(0)).to_have_text("ranks 0-1, 3 in all_reduce at train.py:41")
        expect(groups.nth(1)).to_have_text("rank 2 stopped in __next__ at train.py:38")
        # and the job.hang event is in the events list
        expect(page.locator("#events")).to_contain_text("job.hang")

        # When the reader opens a group, its stack and its ranks show
        groups.nth(1).click()
        opened = page.locator("#hang-groups > li").nth(1)
        expect(opened.locator("pre.stack")).to_contain_text("__next__ (torch/utils/data/dataloader.py:733)")
        expect(opened.locator("pre.stack")).to_contain_text("train (train.py:38)")
        expect(opened).to_contain_text("rank 2 on gpu-b (pid 4002, stopped, step 40, stalled 121.5 s)")

        # And the agent's resource samples are charted, and are no steps of the job
        expect(page.locator("#job-progress")).to_have_text("40/1,000 steps")
        expect(page.locator('[data-chart="res_cpu"] .chart-legend')).to_contain_text("res_cpu_percent")
        expect(page.locator('[data-chart="res_memory"] .chart-legend')).to_contain_text("MiB")

        page.mouse.move(0, 0)
        assert_accessible(page, "hung job page")
        card.screenshot(path=str(ARTIFACTS / "job-hang-card.png"))
        shot(page, "job-hang")
    assert errors == []
