"""Web bench: the jobs list with 100,000 jobs, and the job page in Chromium with a
1,000,000-point loss series, 8 ranks and 100,000 log lines.

Run from the repo root: ``.venv/bin/python bench/web/run.py`` (``--reps 5 --live-seconds 60``).
It creates (and drops) its own PostgreSQL database and starts its own redis-server and daphne;
Debian's Chromium is driven through Playwright. Figures (medians over the repetitions, with
ranges):

- ``job_page_first_chart_ms``: navigation start to the loss chart's first draw (the page marks
  ``chart-drawn:loss`` with the Performance API when uPlot has drawn it), fresh browser context
  each time (cold cache).
- ``live_longest_task_ms``: metric frames published at 10/s (as ingest does: on the job's Redis
  channel, through the web process's fan-out and the websocket) for ``--live-seconds``; the
  longest of: any long task the browser reports (PerformanceObserver ``longtask``, >= 50 ms),
  each websocket message handler, each animation-frame callback (the chart redraws). Before
  each live phase the same page sits for a quarter of that time with no frames arriving:
  ``live_idle_longest_task_ms`` is that baseline (long tasks the loaded machine causes alone).
- ``log_scroll_frame_ms``: 100,000 lines loaded in the log view (once), scrolled 300 frames per
  run; per frame, the time to move the scroll position, render the visible rows and lay the page
  out (forced); the 95th percentile of a run.

- ``job_list_p95_ms``: the jobs list page (``/jobs/``) with 100,000 jobs in PostgreSQL, fetched
  over HTTP from daphne as a signed-in user: the first page and a page 90,000 rows deep of every
  sort order, filtered by state, by owner, by name prefix and by all three; the 95th percentile
  of one pass over those requests, per repetition.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.harness import percentile  # noqa: E402
from bench.web.page import (  # noqa: E402
    LOG_LINES,
    LOSS_POINTS,
    FramePublisher,
    describe_loaf,
    first_chart_ms,
    live_longest_task,
    log_scroll,
)

BENCH_DB = "ty_web_bench"
RANKS = 8
RANK_STEPS = 20_000
LIST_JOBS = 100_000
LIST_OWNERS = 20


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ms (range {min(values):.1f}-{max(values):.1f})"


def seed(job_id: int) -> None:
    """A 1,000,000-point loss series (rank 0), step times and throughput of 8 ranks, and 100,000
    log lines, stored as ingest stores them (raw points and their tiles)."""
    from django.db import connection, transaction

    from console.telemetry.ingest.storage import MetricBatch, store_metrics
    from console.telemetry.models import LogLine

    rng = random.Random(1)
    t0 = time.time()
    chunk = 100_000
    for first in range(1, LOSS_POINTS + 1, chunk):
        rows = [
            (job_id, 1, 0, step, step, "loss", 4.0 / (1 + step / 20_000) + rng.random() * 0.05, t0)
            for step in range(first, min(LOSS_POINTS + 1, first + chunk))
        ]
        with transaction.atomic():
            store_metrics(MetricBatch.of(rows), replay=False)
    stride = LOSS_POINTS // RANK_STEPS
    rows = []
    for rank in range(RANKS):
        slow = 1.8 if rank == 5 else 1.0
        for i in range(RANK_STEPS):
            step = (i + 1) * stride
            value = 0.1 * slow * (1 + 0.1 * rng.random())
            rows.append((job_id, 1, rank, LOSS_POINTS + i * 2, step, "step_time_s", value, t0))
            rows.append((job_id, 1, rank, LOSS_POINTS + i * 2 + 1, step, "samples_per_s", 256 / value, t0))
    with transaction.atomic():
        store_metrics(MetricBatch.of(rows), replay=False)
    now = datetime.now(UTC)
    batch = 20_000
    for first in range(0, LOG_LINES, batch):
        LogLine.objects.bulk_create(
            LogLine(
                job_id=job_id,
                round_number=1,
                rank=i % RANKS,
                stream="stderr" if i % 97 == 0 else "stdout",
                seq=i // RANKS,
                text=f"rank {i % RANKS}: step {i // RANKS} loss {4.0 / (1 + i / 800):.4f} "
                f"samples/s {2400 + i % 300} {'x' * (i % 40)}",
                time=now,
            )
            for i in range(first, min(LOG_LINES, first + batch))
        )
    with connection.cursor() as cur:
        for table in ("telemetry_metric", "telemetry_metricrollup", "telemetry_logline"):
            cur.execute(f"VACUUM ANALYZE {table}")


def job_list_urls(owner: str) -> list[str]:
    """The jobs list requests of one pass: every sort order's first page and a page 90,000 rows
    deep (a cursor at that row, as the page's own Next link would carry), and the filters."""
    from urllib.parse import urlencode

    from console.api.pagination import encode_cursor, key_of
    from console.jobs.models import Job
    from console.jobs.queries import SORTS

    urls = []
    for sort, order in SORTS.items():
        deep = Job.objects.order_by(*order)[90_000]
        urls.append("/jobs/?" + urlencode({"sort": sort}))
        urls.append(
            "/jobs/?" + urlencode({"sort": sort, "cursor": encode_cursor(order, key_of(order, deep))})
        )
    for params in [
        {"state": "RUNNING"},
        {"state": "FAILED", "sort": "name"},
        {"owner": owner},
        {"owner": owner, "sort": "-priority"},
        {"name": "vit-1"},
        {"name": "gpt-99", "sort": "name"},
        {"name": "vit", "state": "PENDING", "owner": owner},
        {"name": "vit-1", "state": "STOPPED", "owner": owner, "sort": "-name"},
    ]:
        urls.append("/jobs/?" + urlencode(params))
    return urls


def job_list_pass(base: str, cookie: str, urls: list[str]) -> list[float]:
    """Milliseconds per request (whole response read), each page checked to hold jobs."""
    import urllib.request

    costs = []
    for url in urls:
        request = urllib.request.Request(base + url, headers={"Cookie": cookie})
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        costs.append((time.perf_counter() - t0) * 1000)
        assert response.status == 200 and b'data-job-id="' in body, url
    return costs


def measure(args: argparse.Namespace, parts: set[str]) -> dict[str, Any]:
    """Seeds the bench database, serves it with Daphne and measures ``parts``; returns the figures."""
    figures: dict[str, Any] = {}
    with harness.Bench("web", database=BENCH_DB, redis="private") as bench:
        from django.contrib.auth.models import User

        from console.jobs.models import Job, Round
        from tests.support.browser import chromium
        from tests.support.jobs import copy_jobs
        from tests.support.telemetry import session_cookie

        cookie = session_cookie(User.objects.create_user("bench", password="bench-pw-1"))
        job = Job.objects.create(
            name="web-bench",
            workload="tiny-lm",
            state="RUNNING",
            round_number=1,
            min_nodes=8,
            max_nodes=8,
            desired_nodes=8,
            progress={"step": LOSS_POINTS},
            hyperparameters={"steps": 2 * LOSS_POINTS},
        )
        Round.objects.create(
            job=job, number=1, reason="start", world_size=RANKS, master_addr="127.0.0.1", master_port=29500
        )
        started = time.monotonic()
        owners = [User.objects.create_user(f"owner-{i}") for i in range(LIST_OWNERS)]
        copy_jobs(LIST_JOBS, owners)
        list_urls = job_list_urls(owners[3].username)
        if parts - {"list"}:
            seed(job.pk)
            print(
                f"seeded {LOSS_POINTS:,} loss points, {RANKS} ranks x {RANK_STEPS:,} step times, "
                f"{LOG_LINES:,} log lines in {time.monotonic() - started:.0f} s",
                flush=True,
            )
        base = bench.console.start_web()
        list_p95 = []
        if "list" in parts:
            job_list_pass(base, cookie, list_urls)  # warm the server once
        for _ in range(args.reps if "list" in parts else 0):
            costs = job_list_pass(base, cookie, list_urls)
            list_p95.append(percentile(costs, 95))
            print(
                f"  job list: {len(costs)} pages, p50 {percentile(costs, 50):.1f} ms, "
                f"p95 {percentile(costs, 95):.1f} ms, max {max(costs):.1f} ms",
                flush=True,
            )
        if list_p95:
            figures["job_list_p95_ms"] = round(statistics.median(list_p95), 1)
            print(f"job list page with {LIST_JOBS:,} jobs (p95 per pass): {summary(list_p95)}", flush=True)

        publisher = FramePublisher(bench.redis_url, job.pk)
        publisher.start()

        with chromium() as browser:
            if "chart" in parts:
                first_chart_ms(browser, base, cookie, job.pk)  # warm the server's caches once
                first = [first_chart_ms(browser, base, cookie, job.pk) for _ in range(args.reps)]
                figures["job_page_first_chart_ms"] = round(statistics.median(first), 1)
                print(f"first chart drawn: {summary(first)} after navigation", flush=True)

            scroll_p95 = []
            runs = log_scroll(browser, base, cookie, job.pk, args.reps) if "scroll" in parts else []
            for costs in runs:
                scroll_p95.append(percentile(costs, 95))
                print(
                    f"  log scroll: p50 {percentile(costs, 50):.2f} ms, p95 {percentile(costs, 95):.2f} ms, "
                    f"max {max(costs):.2f} ms over {len(costs)} frames",
                    flush=True,
                )
            if scroll_p95:
                figures["log_scroll_frame_ms"] = round(statistics.median(scroll_p95), 2)
                print(f"log scroll frame (p95 per run): {summary(scroll_p95)}", flush=True)

            longest, idle_longest = [], []
            for _ in range(args.reps if "live" in parts else 0):
                run = live_longest_task(
                    browser, base, cookie, job.pk, publisher, args.live_seconds, args.live_seconds / 4
                )
                longest.append(run["longest_ms"])
                idle_longest.append(run["idle_longest_ms"])
                print(
                    f"  live {args.live_seconds:.0f} s: {run['published']} frames published, {run['messages']} "
                    f"messages handled, longest task {run['longest_ms']:.1f} ms (script: message handler "
                    f"{run['longest_handler_ms']:.1f} ms, animation frame {run['longest_frame_ms']:.1f} ms), "
                    f"{run['long_tasks']} long tasks (this page's handlers and frames ran "
                    f"{run['script_in_worst_task_ms']:.1f} ms of the longest; JS heap {run['heap_mb']:.0f} MiB); "
                    f"worst long frame {describe_loaf(run['worst_loaf'])}; "
                    f"chart at step {run['last_step_shown']} of {run['last_step_sent']}; "
                    f"long tasks/min {run['long_tasks_per_min']:.1f} live vs {run['idle_long_tasks_per_min']:.1f} "
                    f"idle (same page, no frames; longest idle {run['idle_longest_ms']:.1f} ms)",
                    flush=True,
                )
            if longest:
                figures["live_longest_task_ms"] = round(statistics.median(longest), 1)
                figures["live_idle_longest_task_ms"] = round(statistics.median(idle_longest), 1)
                print(f"live longest task: {summary(longest)}", flush=True)
                print(f"idle baseline (same page, no frames): {summary(idle_longest)}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--live-seconds", type=float, default=60.0)
    parser.add_argument(
        "--parts",
        default="list,chart,scroll,live",
        help="which figures to measure, comma-separated (default: all of list,chart,scroll,live)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"list", "chart", "scroll", "live"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    figures = harness.run(measure, args, parts)
    print()
    print(f"{'figure':32} {'value':>10}  target")
    for key, target in [
        ("job_list_p95_ms", "<= 50 ms"),
        ("job_page_first_chart_ms", "<= 1000 ms"),
        ("live_longest_task_ms", "<= 50 ms"),
        ("live_idle_longest_task_ms", "baseline"),
        ("log_scroll_frame_ms", "< 16 ms"),
    ]:
        if key in figures:
            print(f"{key:32} {figures[key]:>10}  {target}")
    harness.print_json(figures)


if __name__ == "__main__":
    main()
