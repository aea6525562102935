"""Scheduling bench: fair share, utilisation, waits and reclaim on a simulated 200-node cluster.

Run from the repo root: ``.venv/bin/python bench/sched/run.py`` (``--nodes 200 --jobs 2000``).
It creates (and drops) its own database and Redis. The agents are simulated at the protocol's
level, not run as processes: 200 ONLINE node rows (1 CPU slot each, labelled for one pool) whose
commands the controller sends into a recorder, and a loop that plays their part (a started or
resized round runs, a job ends when its work is done). Each tick is the real controller's
``scheduler.schedule()`` against PostgreSQL: the fair queue, quotas, reclaim and placement
(events are stored; their websocket broadcast goes to an in-memory channel layer).

Workload (seeded): 5 workspaces, weights 4:3:2:1:1, nominal quotas in proportion to the weights
(no borrowing limit); jobs of 1-4 nodes at their minimum, about 60% of them elastic up to 3
nodes more, with 2-8 ticks of work at their minimum size. The heaviest workspace submits its
jobs first, the others arrive over the first ticks (so they reclaim what it borrowed).

Three passes of the same workload: ``fair`` (quotas, fair share, shrink before preempting),
``strict`` (no quotas: today's strict priority order) and ``no_shrink`` (quotas, reclaim by
preemption only). Figures:

- ``fair_share_mad_pts``: per tick while any job waits, each workspace's share of the pool
  against its fair share (weights, water-filled by what it asks: a workspace never gets more
  than it runs and waits for); the mean absolute deviation in percentage points (fair pass).
- ``utilisation_pct``: the pool's mean use while any job waits (fair pass), and
  ``strict_utilisation_pct`` the strict pass's.
- ``small_team_wait_ratio``: mean wait (ticks from submission to first start) of the smallest
  workspace's jobs, fair pass over strict pass.
- ``decision_p95_ms``: one scheduling pass (``schedule()``), 95th percentile over the fair
  pass's ticks; ``decision_p95_ms_full_queue`` over the ticks with at least 1,000 jobs pending.
- ``preemptions_avoided_pct``: jobs preempted in the no_shrink pass less those in the fair pass,
  over those in the no_shrink pass.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.harness import percentile  # noqa: E402

BENCH_DB = "ty_sched_bench"
WEIGHTS = {"w-large": 4, "w-big": 3, "w-mid": 2, "w-small": 1, "w-tiny": 1}
SMALLEST = "w-tiny"
KEYS = (
    "fair_share_mad_pts",
    "utilisation_pct",
    "strict_utilisation_pct",
    "small_team_wait_ratio",
    "decision_p95_ms",
    "decision_p95_ms_full_queue",
    "preemptions_avoided_pct",
    "preemptions_fair",
    "preemptions_no_shrink",
    "shrinks_fair",
    "ticks",
    "nodes",
    "jobs",
)


@dataclass(frozen=True)
class Spec:
    workspace: str
    arrives: int  # tick
    min_nodes: int
    max_nodes: int
    work: int  # node-ticks
    priority: int


@dataclass
class Pass:
    name: str
    ticks: int = 0
    shares: list[float] = field(default_factory=list)  # |share - fair| per workspace per tick
    use: list[float] = field(default_factory=list)
    decisions_ms: list[tuple[float, int]] = field(default_factory=list)  # (ms, pending)
    waits: dict[str, list[int]] = field(default_factory=dict)
    preemptions: int = 0
    shrinks: int = 0


class Recorder:
    def send(self, command: Any) -> None:
        return None


def workload(jobs: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    total = sum(WEIGHTS.values())
    specs = []
    for index, (workspace, weight) in enumerate(WEIGHTS.items()):
        count = round(jobs * weight / total)
        for _ in range(count):
            low = rng.choice((1, 1, 2, 2, 3, 4))
            high = low + (rng.choice((1, 2, 3)) if rng.random() < 0.6 else 0)
            specs.append(
                Spec(
                    workspace=workspace,
                    arrives=0 if index == 0 else rng.randrange(index * 2, index * 2 + 20),
                    min_nodes=low,
                    max_nodes=high,
                    work=low * rng.randrange(2, 9),
                    priority=rng.choice((0, 0, 1, 2)) + (2 if index == 0 else 0),
                )
            )
    return specs


def fair_shares(demand: dict[str, int], capacity: int) -> dict[str, float]:
    """Weighted water-filling: each workspace's share of ``capacity`` by weight, none above what
    it asks for, what one leaves going to the others."""
    share = {w: 0.0 for w in demand}
    left = float(capacity)
    active = {w for w, d in demand.items() if d > 0}
    while active and left > 1e-9:
        weight = sum(WEIGHTS[w] for w in active)
        step = {w: left * WEIGHTS[w] / weight for w in active}
        left = 0.0
        for w in list(active):
            room = demand[w] - share[w]
            if step[w] >= room:
                share[w] = float(demand[w])
                left += step[w] - room
                active.discard(w)
            else:
                share[w] += step[w]
    return share


def one_pass(name: str, specs: list[Spec], nodes: int, quotas_on: bool, shrink: bool, max_ticks: int) -> Pass:
    from django.db import connection
    from django.utils import timezone

    from console.cluster.models import Node
    from console.core import transport
    from console.core.states import JobState
    from console.jobs import scheduler
    from console.jobs.models import Allocation, Job
    from console.teams.models import NodePool, Quota, Resource, Workspace
    from console.telemetry.models import Event

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE jobs_allocation, jobs_round, telemetry_event, jobs_job, teams_quota, "
            "teams_nodepool, cluster_gpu, cluster_node CASCADE"
        )
    pool = NodePool.objects.create(name="cpu", selector={"pool": "cpu"}, resource=Resource.CPU)
    workspaces = {}
    for workspace, weight in WEIGHTS.items():
        workspaces[workspace] = Workspace.objects.update_or_create(
            name=workspace, defaults={"weight": weight}
        )[0]
        if quotas_on:
            nominal = nodes * weight // sum(WEIGHTS.values())
            Quota.objects.create(workspace=workspaces[workspace], pool=pool, nominal=nominal)
    Node.objects.bulk_create(
        [
            Node(
                name=f"sim-{i:03d}",
                address=f"10.1.{i // 250}.{i % 250 + 1}",
                slots=1,
                cpus=1,
                state="ONLINE",
                labels={"pool": "cpu"},
                last_heartbeat=timezone.now(),
            )
            for i in range(nodes)
        ]
    )
    result = Pass(name, waits={w: [] for w in WEIGHTS})
    done: dict[int, int] = {}  # job id -> node-ticks of work done (kept across preemption)
    spec_of: dict[int, Spec] = {}
    first_start: dict[int, int] = {}
    queue = sorted(specs, key=lambda s: s.arrives)
    submitted = 0
    with transport.use(Recorder()):
        for tick in range(max_ticks):
            arriving = []
            while submitted < len(queue) and queue[submitted].arrives <= tick:
                arriving.append(queue[submitted])
                submitted += 1
            made = Job.objects.bulk_create(
                [
                    Job(
                        name=f"{s.workspace}-{submitted - len(arriving) + i}",
                        entrypoint="/bin/true",
                        min_nodes=s.min_nodes,
                        max_nodes=s.max_nodes,
                        desired_nodes=s.max_nodes,
                        priority=s.priority,
                        grace_period=5.0,
                        workspace=workspaces[s.workspace],
                        pool=pool,
                    )
                    for i, s in enumerate(arriving)
                ]
            )
            for job, spec in zip(made, arriving, strict=True):
                spec_of[job.pk] = spec
                done[job.pk] = 0
            pending = Job.objects.filter(state=JobState.PENDING).count()
            started = time.perf_counter()
            scheduler.schedule(shrink=shrink)
            result.decisions_ms.append(((time.perf_counter() - started) * 1000, pending))
            # The agents' part: every started or changed round runs.
            Job.objects.filter(state__in=[JobState.STARTING, JobState.RESIZING]).update(
                state=JobState.RUNNING
            )
            held: dict[int, int] = {}
            for job_id, number, current in Allocation.objects.filter(
                round__job__state=JobState.RUNNING
            ).values_list("round__job_id", "round__number", "round__job__round_number"):
                if number == current:
                    held[job_id] = held.get(job_id, 0) + 1
            finished = []
            for job_id, count in held.items():
                first_start.setdefault(job_id, tick)
                done[job_id] += count
                if done[job_id] >= spec_of[job_id].work:
                    finished.append(job_id)
            Job.objects.filter(pk__in=finished).update(state=JobState.SUCCEEDED, finished_at=timezone.now())
            waiting = Job.objects.filter(state=JobState.PENDING).exists()
            if waiting:
                result.use.append(100 * sum(held.values()) / nodes)
                demand = {w: 0 for w in WEIGHTS}
                for ws, high in Job.objects.filter(
                    state__in=[JobState.PENDING, JobState.RUNNING]
                ).values_list("workspace__name", "max_nodes"):
                    demand[ws] += high
                fair = fair_shares(demand, nodes)
                per_ws = {w: 0 for w in WEIGHTS}
                for job_id, count in held.items():
                    per_ws[spec_of[job_id].workspace] += count
                result.shares += [abs(per_ws[w] - fair[w]) * 100 / nodes for w in WEIGHTS]
            result.ticks = tick + 1
            if submitted == len(queue) and not Job.objects.exclude(state=JobState.SUCCEEDED).exists():
                break
    for job_id, tick in first_start.items():
        result.waits[spec_of[job_id].workspace].append(tick - spec_of[job_id].arrives)
    result.preemptions = Event.objects.filter(kind="job.preempted").count()
    result.shrinks = Event.objects.filter(kind="job.shrunk").count()
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    specs = workload(args.jobs, args.seed)
    with harness.Bench("sched", database=BENCH_DB, redis="private"):
        from django.conf import settings

        # Events are stored as always; their broadcast to websocket viewers (there are none)
        # goes to an in-memory layer: a Redis round trip per event is not the decision measured.
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
        passes = {}
        for name, quotas_on, shrink in (
            ("fair", True, True),
            ("strict", False, True),
            ("no_shrink", True, False),
        ):
            started = time.monotonic()
            passes[name] = one_pass(name, specs, args.nodes, quotas_on, shrink, args.max_ticks)
            print(
                f"{name:10s} {passes[name].ticks:4d} ticks in {time.monotonic() - started:6.1f} s", flush=True
            )
    fair, strict, no_shrink = passes["fair"], passes["strict"], passes["no_shrink"]
    full = [ms for ms, pending in fair.decisions_ms if pending >= 1000]
    mean = statistics.fmean
    figures: dict[str, Any] = {
        "fair_share_mad_pts": round(mean(fair.shares), 2) if fair.shares else None,
        "utilisation_pct": round(mean(fair.use), 1) if fair.use else None,
        "strict_utilisation_pct": round(mean(strict.use), 1) if strict.use else None,
        "small_team_wait_ratio": round(
            mean(fair.waits[SMALLEST]) / max(1e-9, mean(strict.waits[SMALLEST])), 3
        )
        if fair.waits[SMALLEST] and strict.waits[SMALLEST]
        else None,
        "decision_p95_ms": round(percentile([ms for ms, _ in fair.decisions_ms], 95), 1),
        "decision_p95_ms_full_queue": round(percentile(full, 95), 1) if full else None,
        "preemptions_avoided_pct": round(
            100 * (no_shrink.preemptions - fair.preemptions) / no_shrink.preemptions, 1
        )
        if no_shrink.preemptions
        else None,
        "preemptions_fair": fair.preemptions,
        "preemptions_no_shrink": no_shrink.preemptions,
        "shrinks_fair": fair.shrinks,
        "ticks": fair.ticks,
        "nodes": args.nodes,
        "jobs": len(specs),
    }
    print(
        f"{'pass':10s} {'ticks':>5s} {'util %':>7s} {'MAD pts':>8s} {'p95 ms':>7s} {'preempt':>7s} {'shrink':>6s}  mean wait by workspace"
    )
    for p in (fair, strict, no_shrink):
        waits = " ".join(f"{w}={mean(v):.1f}" if v else f"{w}=-" for w, v in p.waits.items())
        print(
            f"{p.name:10s} {p.ticks:5d} {mean(p.use) if p.use else 0:7.1f} "
            f"{mean(p.shares) if p.shares else 0:8.2f} {percentile([m for m, _ in p.decisions_ms], 95):7.1f} "
            f"{p.preemptions:7d} {p.shrinks:6d}  {waits}"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--max-ticks", type=int, default=400, help="each pass stops there at the latest")
    args = parser.parse_args()
    figures = harness.run(measure, args)
    harness.print_json(figures, KEYS)


if __name__ == "__main__":
    main()
