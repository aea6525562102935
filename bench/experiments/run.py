"""Experiments bench: comparing 10 jobs of 1,000,000 points each in Chromium, and what early
stopping saves a 16-trial sweep.

Run from the repo root: ``.venv/bin/python bench/experiments/run.py`` (``--reps 5 --sweep-reps 1
--parts compare,sweep``). It runs a whole console of its own (bench/chaos/console.py's
ComposeConsole: web, controller, ingest and three agents on a PostgreSQL cluster and a Redis
server of the run's own) and stops everything it started, also when interrupted.

- ``compare_first_chart_ms``: ten jobs, each with a 1,000,000-point loss series stored as ingest
  stores them (raw points and their 100-step tiles; the first job's rows are copied, scaled, into
  the other nine); navigation start to the first chart's first draw on ``/compare/?jobs=...``
  (the page marks ``chart-drawn:m-loss`` when uPlot has drawn it), a fresh browser context each
  time (cold cache), after one warm-up. Median and range over ``--reps``.
- ``sweep_cost_ratio``: the same 16-trial random-search sweep of digits-mlp (learning rate and
  width; seeded, so both draw the same 16 configurations), 2 trials at once, once without early
  stopping and once with successive halving on test_loss; trial-seconds (each trial's job, from
  its start to its end) with early stopping over trial-seconds without. ``sweep_same_best`` says
  whether both found the same best trial; ``sweep_training_ratio`` counts each trial from its first
  step instead (without the job's start-up: interpreter, imports, data, process group). A pair of sweeps takes about 4-6 minutes here, so one
  pair runs by default (``--sweep-reps``): the 10-minute budget does not hold five.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

JOBS = 10
POINTS = 1_000_000
TRIALS = 16
SWEEP_STEPS = 1500


def summary(values: list[float], unit: str = "") -> str:
    return (
        f"{statistics.median(values):.3g}{unit} (range {min(values):.3g}-{max(values):.3g}, n={len(values)})"
    )


def seed_jobs(log: Any) -> list[int]:
    """Ten jobs of 1,000,000 loss points (and their tiles)."""
    from django.db import connection, transaction

    from console.jobs.models import Job
    from console.telemetry.ingest.storage import MetricBatch, store_metrics

    rng = random.Random(1)
    jobs = [
        Job.objects.create(
            name=f"compare-bench-{i}",
            workload="tiny-lm",
            state="SUCCEEDED",
            hyperparameters={"lr": 3e-4 * (1 + i), "steps": POINTS},
            round_number=1,
        )
        for i in range(JOBS)
    ]
    started = time.monotonic()
    t0 = time.time()
    chunk = 100_000
    first = jobs[0].pk
    for lo in range(1, POINTS + 1, chunk):
        rows = [
            (
                first,
                1,
                0,
                step,
                step,
                "loss",
                4.0 / (1 + step / 20_000) + rng.random() * 0.05,
                t0 + step * 0.01,
            )
            for step in range(lo, min(POINTS + 1, lo + chunk))
        ]
        with transaction.atomic():
            store_metrics(MetricBatch.of(rows), replay=False)
    log(f"seeded job {first}: {POINTS:,} points in {time.monotonic() - started:.0f} s")
    with connection.cursor() as cur:
        for i, job in enumerate(jobs[1:], 1):
            factor = 1.0 + 0.05 * i
            cur.execute(
                "INSERT INTO telemetry_metric (job_id, round_number, rank, seq, step, name, value, time) "
                "SELECT %s, round_number, rank, seq, step, name, value * %s, time FROM telemetry_metric "
                "WHERE job_id = %s",
                [job.pk, factor, first],
            )
            cur.execute(
                "INSERT INTO telemetry_metricrollup (job_id, round_number, rank, name, bucket_step, last_step, "
                "min_value, max_value, total, count, first_time, last_time) "
                "SELECT %s, round_number, rank, name, bucket_step, last_step, min_value * %s, max_value * %s, "
                "total * %s, count, first_time, last_time FROM telemetry_metricrollup WHERE job_id = %s",
                [job.pk, factor, factor, factor, first],
            )
        for table in ("telemetry_metric", "telemetry_metricrollup"):
            cur.execute(f"VACUUM ANALYZE {table}")
    log(f"seeded {JOBS} jobs x {POINTS:,} points in {time.monotonic() - started:.0f} s")
    return [job.pk for job in jobs]


def first_chart_ms(browser: Any, base: str, cookie: str, ids: list[int]) -> float:
    name, value = cookie.split("=", 1)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": name, "value": value, "url": base}])
    try:
        page = context.new_page()
        page.goto(f"{base}/compare/?jobs={','.join(map(str, ids))}")
        mark = "chart-drawn:m-loss"
        page.wait_for_function(f"() => performance.getEntriesByName('{mark}').length > 0", timeout=60000)
        drawn = page.evaluate(f"() => performance.getEntriesByName('{mark}')[0].startTime")
        parts = page.evaluate(
            """() => {
              const nav = performance.getEntriesByType('navigation')[0];
              const series = performance.getEntriesByType('resource').find((r) => r.name.includes('/compare/series/'));
              const script = performance.getEntriesByType('resource').find((r) => r.name.includes('compare.js'));
              return {html: nav.responseEnd, script: script ? script.responseEnd : null,
                      series_start: series ? series.startTime : null, series_ttfb: series ? series.responseStart : null,
                      series_end: series ? series.responseEnd : null};
            }"""
        )
        print(f"    ({', '.join(f'{k} {v:.0f}' for k, v in parts.items() if v is not None)} ms)", flush=True)
        lines = page.evaluate("() => document.querySelectorAll('#compare-jobs tbody tr').length")
        if lines != len(ids):
            raise RuntimeError(f"the page lists {lines} jobs, not {len(ids)}")
        return float(drawn)
    finally:
        context.close()


def measure_compare(console: Any, reps: int, log: Any) -> dict[str, Any]:
    from django.contrib.auth.models import User

    from tests.support.browser import chromium
    from tests.support.telemetry import session_cookie

    ids = seed_jobs(log)
    cookie = session_cookie(User.objects.create_user(f"bench-{uuid.uuid4().hex[:6]}", password="bench-pw-1"))
    base = f"http://127.0.0.1:{console.web_port}"
    with chromium() as browser:
        first_chart_ms(browser, base, cookie, ids)  # warm the server's caches once
        runs = []
        for rep in range(reps):
            runs.append(first_chart_ms(browser, base, cookie, ids))
            log(f"  compare rep {rep + 1}: first chart drawn {runs[-1]:.0f} ms after navigation")
    log(f"compare {JOBS} jobs x {POINTS:,} points, first chart: {summary(runs, ' ms')}")
    return {
        "compare_first_chart_ms": round(statistics.median(runs), 1),
        "compare_first_chart_ms_range": [round(min(runs), 1), round(max(runs), 1)],
    }


def sweep_body(pruner: str) -> dict[str, Any]:
    return {
        "name": f"bench-{pruner}",
        "job": {
            "workload": "digits-mlp",
            "grace_period": 5,
            "hyperparameters": {
                "steps": SWEEP_STEPS,
                "log_every": 25,
                "checkpoint_every": 0,
                "watch_every": 100_000,
            },
        },
        "space": {
            "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
            "hidden": [16, 32, 64, 128],
        },
        "sampler": "random",
        "seed": 3,
        "objective": "test_loss",
        "max_trials": TRIALS,
        "parallel": 2,
        "pruner": pruner,
        "pruner_options": {"min_resource": 75, "reduction_factor": 3}
        if pruner == "successive_halving"
        else {},
    }


def run_sweep(console: Any, pruner: str, log: Any) -> dict[str, Any]:
    response = console.http("post", "/api/v1/sweeps/", json=sweep_body(pruner))
    if response.status_code != 201:
        raise RuntimeError(f"sweep refused: {response.status_code} {response.text[:500]}")
    sweep_id = response.json()["id"]
    started = time.monotonic()
    while True:
        detail = console.http("get", f"/api/v1/sweeps/{sweep_id}/").json()
        if detail["state"] != "RUNNING":
            break
        if time.monotonic() - started > 480:
            console.http("post", f"/api/v1/sweeps/{sweep_id}/stop/")
            raise RuntimeError(f"sweep {pruner} did not end within 480 s")
        time.sleep(2)
    seconds = sum(t["seconds"] or 0.0 for t in detail["trials"])
    training = 0.0  # from each trial's first step to its end: what early stopping can save
    for trial in detail["trials"]:
        job = console.http("get", f"/api/v1/jobs/{trial['job']}/").json()
        first = min((r["first_step_at"] for r in job["rounds"] if r["first_step_at"]), default=None)
        if first and job["finished_at"]:
            from datetime import datetime

            training += (
                datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(first)
            ).total_seconds()
    best = detail["best"] or {}
    log(
        f"  sweep ({pruner}): {detail['state']} in {time.monotonic() - started:.0f} s, {seconds:.0f} trial-seconds, "
        f"{detail['counts']['PRUNED']} pruned, best trial {best.get('number')} ({best.get('value')})"
    )
    log(f"    of which from first step to end: {training:.0f} s")
    return {
        "seconds": seconds,
        "training": training,
        "best": best.get("number"),
        "state": detail["state"],
        "value": best.get("value"),
    }


def measure_sweeps(console: Any, reps: int, log: Any) -> dict[str, Any]:
    ratios, training, same = [], [], []
    for _ in range(reps):
        full = run_sweep(console, "none", log)
        halved = run_sweep(console, "successive_halving", log)
        ratios.append(halved["seconds"] / full["seconds"] if full["seconds"] else float("nan"))
        training.append(halved["training"] / full["training"] if full["training"] else float("nan"))
        same.append(full["best"] is not None and full["best"] == halved["best"])
        log(f"  cost ratio {ratios[-1]:.3f}, same best trial: {same[-1]}")
    log(f"sweep cost ratio (successive halving / none): {summary(ratios)}")
    return {
        "sweep_cost_ratio": round(statistics.median(ratios), 3),
        "sweep_cost_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "sweep_training_ratio": round(statistics.median(training), 3),
        "sweep_same_best": all(same),
        "sweep_reps": reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="first-chart repetitions")
    parser.add_argument("--sweep-reps", type=int, default=1, help="pairs of sweeps (about 5 minutes each)")
    parser.add_argument("--parts", default="compare,sweep")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    from bench.chaos.console import ComposeConsole
    from bench.chaos.infra import sweep as sweep_processes

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    root = Path(tempfile.mkdtemp(prefix="experiments-bench-"))
    root.chmod(0o755)  # PostgreSQL runs as its own user and must reach its directory
    run_id = uuid.uuid4().hex[:12]
    console = ComposeConsole(root, run_id)
    figures: dict[str, Any] = {}
    log = lambda text: print(text, flush=True)  # noqa: E731
    try:
        started = time.monotonic()
        console.start()
        log(f"console up in {time.monotonic() - started:.0f} s ({root})")
        os.environ.update(
            {k: console.env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")},
            DJANGO_SETTINGS_MODULE="console.settings",
            LOG_LEVEL="WARNING",
        )
        import django

        django.setup()
        if "sweep" in parts:
            figures.update(measure_sweeps(console, args.sweep_reps, log))
        if "compare" in parts:
            figures.update(measure_compare(console, args.reps, log))
    finally:
        if "django" in sys.modules and os.environ.get("DJANGO_SETTINGS_MODULE"):
            from django.db import connections

            connections.close_all()
        console.close()
        sweep_processes(run_id)

    print()
    print(f"{'figure':28} {'value':>10}  target")
    for key, target in [("compare_first_chart_ms", "<= 1000 ms"), ("sweep_cost_ratio", "<= 0.5, same best")]:
        if key in figures:
            print(f"{key:28} {figures[key]:>10}  {target}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
