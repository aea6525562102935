"""REST API latency: the jobs list over 100,000 jobs, and token-authenticated requests.

    .venv/bin/python bench/api/run.py [--jobs 100000] [--reps 5] [--requests 20] [--token-requests 1000]

Makes its own database (``trainyard_api_bench``), fills it with ``jobs`` jobs (5 owners, 8 states,
40 name prefixes with repeats, priorities, creation times over 100 days; a current round with
allocations for the running ones), serves the console with Daphne on a free port and calls it over
HTTP with one keep-alive connection, as a script or the CLI would.

1. ``/api/v1/jobs/``: for each filter and sort (none, state, several states, owner, name prefix,
   created range, sort by name, by priority, all filters at once), ``requests`` calls for the
   first page and ``requests`` calls for pages deep in the list (cursors at random positions up
   to the end: the key of the row there, as a ``next`` link would carry it). One repetition's
   p95 is over all of its calls; the figure is the median (and range) of ``reps`` repetitions.
   The same requests against a console holding 1,000 jobs give the baseline: the ratio shows
   what the list's size costs, apart from what a request costs on this (shared) machine.
2. ``token_requests`` sequential GETs of ``/api/v1/nodes/`` with a bearer token (lookup, lockout
   check, scope check, last-use), against the same with a session cookie as the baseline.

The last line is JSON with ``jobs_list_p95_ms`` and ``token_request_p95_ms`` (medians over reps).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.harness import database_url  # noqa: E402

BENCH_DB = "trainyard_api_bench"
SMALL_DB = "trainyard_api_bench_small"
# The same requests against a console holding this many jobs: the baseline of the ratio.
SMALL_JOBS = 1000
STATES = ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", "STARTING", "RESIZING", "RESTARTING"]
STATE_WEIGHTS = [10, 5, 50, 15, 15, 2, 1, 2]
OWNERS = ["ana", "bo", "cy", "dee", "eli"]
PREFIXES = [f"{word}-{size}" for word in ("bert", "gpt", "dlrm", "mlp", "vit") for size in range(8)]
BATCH = 5000
LIMIT_MS = 50.0


def setup_django(home: Path, name: str) -> None:
    os.environ.update(DATABASE_URL=database_url(name), TRAINYARD_HOME=str(home))
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(jobs: int) -> dict[str, Any]:
    """``jobs`` jobs in batches; running ones get a current round on a node. Returns what the
    scenarios need (ids and names)."""
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from console.api.models import ApiToken
    from console.cluster.models import Node
    from console.jobs.models import Allocation, Job, Round

    rng = random.Random(14)
    owners = [User.objects.create_user(name, password=None) for name in OWNERS]
    staff = User.objects.create_user("bench", password="bench-password-1", is_staff=True, is_superuser=True)
    staff.groups.add(Group.objects.get_or_create(name="operator")[0])
    nodes = [Node.objects.create(name=f"gpu-{i:02d}", state="ONLINE", slots=8) for i in range(20)]
    start = datetime.now(UTC) - timedelta(days=100)
    made = 0
    while made < jobs:
        batch = []
        for _ in range(made, min(jobs, made + BATCH)):
            state = rng.choices(STATES, STATE_WEIGHTS)[0]
            batch.append(
                Job(
                    name=f"{rng.choice(PREFIXES)}-{rng.randrange(1000)}",
                    owner=rng.choice(owners),
                    workload="digits-mlp",
                    state=state,
                    round_number=1 if state in ("RUNNING", "RESIZING", "RESTARTING", "STARTING") else 0,
                    priority=rng.randrange(-5, 6),
                    min_nodes=1,
                    max_nodes=2,
                    desired_nodes=2,
                )
            )
        created = Job.objects.bulk_create(batch)
        # bulk_create sets created_at to now; spread it over 100 days in submission order.
        for job in created:
            job.created_at = start + timedelta(seconds=86400 * 100 * (job.pk % jobs) / jobs)
        Job.objects.bulk_update(created, ["created_at"], batch_size=1000)
        live = [j for j in created if j.round_number]
        rounds = Round.objects.bulk_create(
            Round(job=j, number=1, reason="start", world_size=4, master_addr="10.0.0.1", master_port=29500)
            for j in live
        )
        Allocation.objects.bulk_create(
            Allocation(round=r, node=nodes[(r.pk + k) % len(nodes)], node_rank=k, nproc=2)
            for r in rounds
            for k in range(2)
        )
        made += len(batch)
        print(f"  seeded {made}/{jobs} jobs", flush=True)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    token = ApiToken.issue(staff, "bench", ["read"])[1]
    return {"token": token, "owner": OWNERS[1]}


def deep_cursors(sort: str, params: dict[str, str], count: int, rng: random.Random) -> list[str | None]:
    """Cursors at random positions through the filtered list, built from the rows' keys exactly
    as the API's next links are."""
    from console.api.pagination import complete_ordering, encode_cursor
    from console.jobs.queries import SORTS, filter_jobs

    found = filter_jobs(params)
    assert found.is_valid(), found.errors
    sort_key = complete_ordering(SORTS[sort])
    fields = [term.lstrip("-") for term in sort_key]
    total = found.qs.count()
    cursors: list[str | None] = []
    for _ in range(count):
        if total == 0:
            cursors.append(None)  # nothing matches: the "deep" page is the first
            continue
        position = rng.randrange(max(1, total - 1))
        row = found.qs.values_list(*fields)[position]
        key = [v.isoformat() if hasattr(v, "isoformat") else v for v in row]
        cursors.append(encode_cursor(sort_key, key))
    return cursors


def scenarios(owner: str) -> dict[str, dict[str, str]]:
    now = datetime.now(UTC)
    week = {
        "created_after": (now - timedelta(days=40)).isoformat(),
        "created_before": (now - timedelta(days=33)).isoformat(),
    }
    return {
        "no filter": {},
        "state=RUNNING": {"state": "RUNNING"},
        "state=PENDING,FAILED": {"state": "PENDING,FAILED"},
        "owner": {"owner": owner},
        "name prefix": {"name": "gpt-3"},
        "created range": week,
        "sort=name": {"sort": "name"},
        "sort=-priority": {"sort": "-priority"},
        "all filters": {"state": "SUCCEEDED", "owner": owner, "name": "bert", **week},
    }


def get_ms(session: Any, url: str, params: dict[str, str] | None = None) -> float:
    """One GET's wall time in milliseconds (a failed call stops the bench)."""
    started = time.perf_counter()
    session.get(url, params=params, timeout=30).raise_for_status()
    return (time.perf_counter() - started) * 1000


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def seed_child(args: argparse.Namespace) -> None:
    """``--seed-into DB``: migrate and fill one database, print what the measuring needs as JSON.
    (A process per database: Django binds its settings to one.)"""
    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-api-seed-"))
    setup_django(home, args.seed_into)
    seeded = seed(args.jobs)
    rng = random.Random(7)
    seeded["cursors"] = {
        name: deep_cursors(params.get("sort", "-created_at"), params, args.requests, rng)
        for name, params in scenarios(seeded["owner"]).items()
    }
    print("SEEDED " + json.dumps(seeded), flush=True)


def serve(bench: harness.Bench, name: str, jobs: int, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """A fresh database of ``jobs`` jobs and Daphne serving it; returns its URL and seed data."""
    import requests

    bench.add_database(name)
    home = bench.root / name
    print(f"database {name}: migrating and seeding {jobs} jobs", flush=True)
    seeding = subprocess.run(
        [
            sys.executable,
            __file__,
            "--seed-into",
            name,
            "--jobs",
            str(jobs),
            "--requests",
            str(args.requests),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in seeding.stdout.splitlines() if ln.startswith("SEEDED ")]
    if seeding.returncode != 0 or not lines:
        raise SystemExit(f"seeding {name} failed:\n{seeding.stdout[-2000:]}\n{seeding.stderr[-3000:]}")
    seeded: dict[str, Any] = json.loads(lines[0][len("SEEDED ") :])
    env = {
        **os.environ,
        "DATABASE_URL": database_url(name),
        "TRAINYARD_HOME": str(home),
        "LOG_LEVEL": "WARNING",
    }
    base = bench.console_of(name, env).start_web()
    probe = requests.get(
        f"{base}/api/v1/nodes/", headers={"Authorization": f"Bearer {seeded['token']}"}, timeout=30
    )
    if probe.status_code != 200:
        raise SystemExit(f"the console on {name} answers {probe.status_code}: {probe.text[:500]}")
    return base, seeded


def measure_list(base: str, seeded: dict[str, Any], args: argparse.Namespace, label: str) -> dict[str, Any]:
    import requests

    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {seeded['token']}"
    cases = scenarios(seeded["owner"])
    per_scenario: dict[str, list[float]] = {name: [] for name in cases}
    list_p95: list[float] = []
    for _ in range(args.reps):
        rep_times: list[float] = []
        for name, params in cases.items():
            warm = api.get(f"{base}/api/v1/jobs/", params=params, timeout=30)
            assert warm.status_code == 200, warm.text[:300]
            times = []
            for i in range(args.requests):
                times.append(get_ms(api, f"{base}/api/v1/jobs/", params))
                deep = {**params, "cursor": seeded["cursors"][name][i] or ""}
                times.append(get_ms(api, f"{base}/api/v1/jobs/", deep))
            per_scenario[name].append(p95(times))
            rep_times += times
        list_p95.append(p95(rep_times))
        print(f"  {label}: jobs list p95 {list_p95[-1]:.1f} ms", flush=True)
    return {"per_scenario": per_scenario, "list": list_p95}


def measure_tokens(base: str, seeded: dict[str, Any], args: argparse.Namespace) -> dict[str, list[float]]:
    import requests

    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {seeded['token']}"
    # A session cookie for the baseline: sign in through the login form.
    web = requests.Session()
    web.get(f"{base}/accounts/login/", timeout=30)
    web.post(
        f"{base}/accounts/login/",
        data={
            "username": "bench",
            "password": "bench-password-1",
            "csrfmiddlewaretoken": web.cookies.get("csrftoken", ""),
        },
        headers={"Referer": f"{base}/accounts/login/"},
        timeout=30,
        allow_redirects=False,
    )
    assert "sessionid" in web.cookies
    token_p95: list[float] = []
    session_p95: list[float] = []
    for rep in range(args.reps):
        for client, into in ((api, token_p95), (web, session_p95)):
            times = [get_ms(client, f"{base}/api/v1/nodes/") for _ in range(args.token_requests)]
            into.append(p95(times))
        print(
            f"  rep {rep + 1}: token p95 {token_p95[-1]:.1f} ms, session p95 {session_p95[-1]:.1f} ms",
            flush=True,
        )
    return {"token": token_p95, "session": session_p95}


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Both consoles run side by side and each repetition measures one then the other, so the
    ratio compares them under the same load of this shared machine."""
    with harness.Bench("api", redis=None, django=False) as bench:
        big, big_seed = serve(bench, BENCH_DB, args.jobs, args)
        small, small_seed = serve(bench, SMALL_DB, SMALL_JOBS, args)
        return measure_both(args, big, big_seed, small, small_seed)


def measure_both(
    args: argparse.Namespace, big: str, big_seed: dict[str, Any], small: str, small_seed: dict[str, Any]
) -> dict[str, Any]:
    one_rep = argparse.Namespace(**{**vars(args), "reps": 1})
    result: dict[str, Any] = {"per_scenario": {}, "list": [], "small": {"list": []}}
    for rep in range(args.reps):
        measured = measure_list(big, big_seed, one_rep, f"rep {rep + 1}, {args.jobs} jobs")
        baseline = measure_list(small, small_seed, one_rep, f"rep {rep + 1}, {SMALL_JOBS} jobs")
        for name, values in measured["per_scenario"].items():
            result["per_scenario"].setdefault(name, []).extend(values)
        result["list"] += measured["list"]
        result["small"]["list"] += baseline["list"]
    result.update(measure_tokens(big, big_seed, args))
    return result


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f}  ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--requests", type=int, default=20, help="first-page and deep-page calls per scenario"
    )
    parser.add_argument("--token-requests", type=int, default=1000)
    parser.add_argument("--seed-into", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_into:
        seed_child(args)
        return
    result = harness.run(run_bench, args)  # SIGINT, SIGTERM: every process stopped, databases dropped

    print(f"\n/api/v1/jobs/ over {args.jobs} jobs: p95 per scenario, ms, median (range) of {args.reps} reps")
    print(f"{'scenario':<22} {'p95 ms':>7}")
    for name, values in result["per_scenario"].items():
        print(f"{name:<22} {summary(values)}")
    print(f"{'all (first + deep)':<22} {summary(result['list'])}   limit {LIMIT_MS:.0f} ms")
    small = result["small"]["list"]
    print(f"{'same, 1000 jobs':<22} {summary(small)}")
    scale = statistics.median(b / s for b, s in zip(result["list"], small, strict=True))
    print(f"{f'{args.jobs} / {SMALL_JOBS} jobs':<22} {scale:7.2f}")
    print(
        f"\n{args.token_requests} sequential GET /api/v1/nodes/, p95 ms, median (range) of {args.reps} reps"
    )
    print(f"{'bearer token':<22} {summary(result['token'])}")
    print(f"{'session cookie':<22} {summary(result['session'])}")
    ratio = statistics.median(t / s for t, s in zip(result["token"], result["session"], strict=True))
    print(f"{'token / session':<22} {ratio:7.2f}")
    figures = {
        "jobs_list_p95_ms": round(statistics.median(result["list"]), 2),
        "jobs_list_p95_ms_range": [round(min(result["list"]), 2), round(max(result["list"]), 2)],
        "token_request_p95_ms": round(statistics.median(result["token"]), 2),
        "token_request_p95_ms_range": [round(min(result["token"]), 2), round(max(result["token"]), 2)],
        "session_request_p95_ms": round(statistics.median(result["session"]), 2),
        "token_over_session_p95": round(ratio, 3),
        "jobs_list_p95_ms_1k_jobs": round(statistics.median(small), 2),
        "jobs_list_100k_over_1k_p95": round(scale, 3),
        "jobs": args.jobs,
        "reps": args.reps,
    }
    harness.print_json(figures)


if __name__ == "__main__":
    main()
