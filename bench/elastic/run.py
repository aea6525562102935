"""Elastic recovery: Trainyard's controller against torchrun's c10d rendezvous, same script.

    .venv/bin/python bench/elastic/run.py [--reps 5] [--plain-only | --inplace-only] [--c10d] [--keep DIR]

Plain-script cases run tests/scripts/plain_ddp.py (no SDK: DDP, a DataLoader with a
DistributedSampler and one worker process, a ``torch.save`` snapshot every 5 steps read back with
``torch.load``), timed from its own per-step log, on the restart path:
- rank kill → next step: SIGKILL one of two ranks of a 1-node x 2-process job; reps alternate
  with torchrun ``--standalone --max-restarts 3`` on the same script, so both see the same load.
  ``plain_rank_kill_ratio`` is Trainyard's median over torchrun's median of the reps of this run
  in which torchrun recovered within TORCHRUN_WAIT; null if none did. torchrun runs with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (see TORCHRUN_ENV): without it, its restart often
  fails in gloo's connectFullMesh on the previous attempt's keys. Most of torchrun's time here is
  its survivor's exit: torchrun SIGTERMs the rank's whole process group, the DataLoader worker
  dies with it, and the rank's exit then waits about 5 s in the DataLoader's teardown (with
  ``--workers 0`` torchrun's restart took 3.1-4.4 s, with one worker 4.0-9.0 s, mostly 8.5 s). Trainyard signals the
  interpreter only (workers/agent/launcher.py ``stop_signal_target``).
- scale-up 2 → 3 → first step at world 3, timed from the API call (``plain_scale_up_s``).
- node kill → first step at the smaller world: SIGKILL one of three hosts (agent and ranks)
  of a 3 x 1 job; Trainyard's agents heartbeat every 2 s (``plain_node_loss_s``).
Each Trainyard case starts once the agents' warm pools have settled (as the in-place cases do):
on this 2-core machine three agents and the ranks share the cores, and a pool refills only on
idle CPU, so back-to-back cases would otherwise measure cold starts.

In-place cases (``inplace_*``) run tests/scripts/elastic_count.py (sdk.elastic, job spec
``elastic: inplace``) on the same cluster: resize 2 → 3 → first step at world 3, and 3 → 2 →
first step of the new round, both timed from the API call; then, on a 3 x 1 job, a rank SIGKILL →
the survivors' next step (in place: a newcomer replaces the rank), and a node loss (agent and
ranks SIGKILLed) → first step at world 2, timed from the node-loss round's creation (the loss
declared). In-place recovery is the controller's default. Without ``--plain-only`` or
``--inplace-only`` both run (the plain rank kills first, then the in-place cases, then the plain
scale-up and node kill), in about 9.5 minutes with 5 reps here, and the final JSON line holds every
figure; a figure is null when one of its reps gave none (the output says why). ``--c10d`` adds torchrun's c10d scale-up and node kill, for comparison only (no figure
depends on them; here they seldom recover within TORCHRUN_WAIT, which costs about 2 minutes).
Needs PostgreSQL and Redis on 127.0.0.1 (a bench database is created and dropped).

Where a plain script's restart spends its time (one 2-core machine, warm pools settled; from
the agents' logs and plain_ddp.py's ``phases``; docs/architecture.md has the table):
rank kill ≈ exit seen 0.05 s + report, settlement and new round 0.15 s + survivor killed and
round ended 0.1 s + warm hand-over 0.03 s + init_process_group 0.02-0.3 s + the first optimizer
importing torch._dynamo 0.8-2.5 s + DDP 0.01 s + DataLoader worker and first step 0.15-0.3 s.
The dynamo import is gone since: the warm pool preloads it (workers/agent/warm.py).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from bench.elastic.common import HEARTBEAT, TORCHRUN_WAIT  # noqa: E402
from bench.elastic.torchrun import torchrun_node_kill, torchrun_rank_kill, torchrun_scale_up  # noqa: E402
from bench.elastic.trainyard import Trainyard  # noqa: E402

BENCH_DB = os.environ.get("BENCH_DB", "trainyard_bench_elastic")
BENCH_REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


def median(values: list[float | None]) -> float | None:
    done = [v for v in values if v is not None]
    return statistics.median(done) if len(done) == len(values) and done else None


def fmt(value: float | None, waited: float) -> str:
    return f"{value:6.2f} s" if value is not None else f"none in {waited:.0f} s"


def measure(
    name: str, reps: int, run: Callable[[Path], float | None], root: Path, give_up_after: int
) -> list[float | None]:
    values: list[float | None] = []
    for rep in range(reps):
        work = root / f"{name}-{rep}"
        work.mkdir(parents=True)
        value = run(work)
        values.append(value)
        print(f"  {name:<26} rep {rep + 1}: {fmt(value, TORCHRUN_WAIT)}", flush=True)
        if rep + 1 >= give_up_after and all(v is None for v in values):
            print(f"  {name:<26} stopped after {rep + 1} reps: never recovered", flush=True)
            break
    return values


def measure_inplace(reps: int, ty: Trainyard, root: Path) -> dict[str, list[float | None]]:
    print("SDK script in place (sdk.elastic): resize 2→3, then 3→2, from the API call", flush=True)
    found: dict[str, list[float | None]] = {
        "scale_up": [],
        "scale_down": [],
        "rank_kill": [],
        "node_loss": [],
    }
    for rep in range(reps):
        work = root / f"rep-{rep}"
        work.mkdir(parents=True)
        up, down = ty.inplace_resizes(work)
        found["scale_up"].append(up)
        found["scale_down"].append(down)
        print(f"  {'in place 2→3 / 3→2':<26} rep {rep + 1}: {fmt(up, 60)} / {fmt(down, 60)}", flush=True)
    print("SDK script in place: rank SIGKILL (from the kill), node loss (from the loss declared)", flush=True)
    for rep in range(reps):
        work = root / f"fail-{rep}"
        work.mkdir(parents=True)
        ty.kill_settled = None
        kill, loss = ty.inplace_failures(work)
        found["rank_kill"].append(kill)
        found["node_loss"].append(loss)
        settled = (
            f"  (round made {ty.kill_settled:.2f} s after the kill)" if ty.kill_settled is not None else ""
        )
        print(
            f"  {'rank kill / node loss':<26} rep {rep + 1}: {fmt(kill, 60)} / {fmt(loss, 60)}{settled}",
            flush=True,
        )
    return found


def spread(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    return f"{min(done):.2f}-{max(done):.2f} s" if done else "-"


def print_inplace(found: dict[str, list[float | None]]) -> None:
    print()
    print(f"{'in place (median of reps)':<34} {'median':>10} {'range':>16} {'target':>8}")
    for label, key in (
        ("resize 2→3 → step at world 3", "scale_up"),
        ("resize 3→2 → step in new round", "scale_down"),
        ("rank SIGKILL → next step", "rank_kill"),
        ("node loss declared → step at 2", "node_loss"),
    ):
        target = {"rank_kill": "1.5 s", "node_loss": "2.0 s"}.get(key, "1.0 s")
        print(f"{label:<34} {fmt(median(found[key]), 60):>10} {spread(found[key]):>16} {target:>8}")


def inplace_figures(found: dict[str, list[float | None]]) -> dict[str, Any]:
    return {
        "inplace_scale_up_s": median(found["scale_up"]),
        "inplace_scale_down_s": median(found["scale_down"]),
        "inplace_scale_up_runs": found["scale_up"],
        "inplace_scale_down_runs": found["scale_down"],
        "inplace_rank_kill_s": median(found["rank_kill"]),
        "inplace_node_loss_s": median(found["node_loss"]),
        "inplace_rank_kill_runs": found["rank_kill"],
        "inplace_node_loss_runs": found["node_loss"],
    }


def measure_pairs(
    reps: int, ty: Callable[[Path], float | None], tr: Callable[[Path], float | None], root: Path
) -> tuple[list[float | None], list[float | None]]:
    """Rank kill, Trainyard and torchrun rep by rep in turn: on a shared machine both sides of the
    ratio then see the same load."""
    ours: list[float | None] = []
    theirs: list[float | None] = []
    for rep in range(reps):
        for name, run, out, waited in (
            ("trainyard", ty, ours, 60.0),
            ("torchrun", tr, theirs, TORCHRUN_WAIT),
        ):
            work = root / f"rank-kill-{name}-{rep}"
            work.mkdir(parents=True)
            value = run(work)
            out.append(value)
            print(f"  {'rank kill ' + name:<26} rep {rep + 1}: {fmt(value, waited)}", flush=True)
    return ours, theirs


def measure_plain_rank_kill(reps: int, ty: Trainyard, root: Path) -> dict[str, dict[str, list[float | None]]]:
    """First of all cases: the rank kill is the one case with two ranks on a host, and a freshly
    started agent's pool holds its cap (4), enough for the job's start and its restart. After
    the in-place cases a pool aims at twice one rank, and its first restart of two ranks would
    wait for imports."""
    print("plain script (tests/scripts/plain_ddp.py): Trainyard restart path against torchrun", flush=True)
    results: dict[str, dict[str, list[float | None]]] = {"trainyard": {}, "torchrun": {}}
    results["trainyard"]["rank_kill"], results["torchrun"]["rank_kill"] = measure_pairs(
        reps, ty.rank_kill, torchrun_rank_kill, root
    )
    return results


def measure_plain_resizes(
    reps: int, ty: Trainyard, root: Path, results: dict[str, dict[str, list[float | None]]]
) -> None:
    print("plain script: scale-up and node kill", flush=True)
    results["trainyard"]["scale_up"] = measure("scale-up 2→3", reps, ty.scale_up, root / "ty", reps)
    results["trainyard"]["node_kill"] = measure("node kill", reps, ty.node_kill, root / "ty", reps)


def measure_torchrun_resizes(
    reps: int, results: dict[str, dict[str, list[float | None]]], root: Path
) -> None:
    """torchrun's c10d scale-up and node kill, for comparison (no figure depends on them)."""
    print("torchrun (c10d)", flush=True)
    results["torchrun"]["scale_up"] = measure("scale-up 2→3", reps, torchrun_scale_up, root / "tr", 2)
    results["torchrun"]["node_kill"] = measure("node kill", reps, torchrun_node_kill, root / "tr", 2)


def plain_figures(results: dict[str, dict[str, list[float | None]]]) -> dict[str, Any]:
    cases = [
        ("rank kill → next step", "rank_kill"),
        ("scale-up 2→3 → step at world 3", "scale_up"),
        ("node kill → step at world 2", "node_kill"),
    ]
    print()
    print(
        f"{'plain script (median of reps)':<34} {'Trainyard':>14} {'range':>14} {'torchrun':>16} {'ratio':>7}"
    )
    figures: dict[str, Any] = {}
    for label, key in cases:
        ours, theirs = results["trainyard"].get(key, []), results["torchrun"].get(key, [])
        ty_m, tr_m = median(ours), median(theirs) if theirs else None
        ratio = ty_m / tr_m if ty_m is not None and tr_m else None
        theirs_text = fmt(tr_m, TORCHRUN_WAIT) if theirs else "not run"
        print(
            f"{label:<34} {fmt(ty_m, 60):>14} {spread(ours):>14} {theirs_text:>16} "
            f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>7}"
        )
        figures[f"trainyard_{key}_s"] = ty_m
        figures[f"trainyard_{key}_runs"] = ours
        if theirs:
            figures[f"torchrun_{key}_s"] = tr_m
            figures[f"torchrun_{key}_runs"] = theirs
    # Should torchrun not recover in a rep, the ratio is taken against the reps of this run
    # where it did, and is null when none did. Never against a figure from another run.
    rk_ty = figures["trainyard_rank_kill_s"]
    runs = results["torchrun"]["rank_kill"]
    recovered = [v for v in runs if v is not None]
    basis = statistics.median(recovered) if recovered else None
    figures["torchrun_rank_kill_recovered"] = f"{len(recovered)} of {len(runs)}"
    figures["torchrun_rank_kill_recovered_s"] = basis
    figures["plain_rank_kill_ratio"] = rk_ty / basis if rk_ty is not None and basis else None
    figures["plain_scale_up_s"] = figures["trainyard_scale_up_s"]
    figures["plain_node_loss_s"] = figures["trainyard_node_kill_s"]
    ratio = figures["plain_rank_kill_ratio"]
    print(
        f"rank kill: torchrun recovered in {figures['torchrun_rank_kill_recovered']} reps; "
        f"Trainyard / torchrun (those reps) = {f'{ratio:.2f}' if ratio is not None else '-'}"
    )
    figures["torchrun_wait_s"] = TORCHRUN_WAIT
    print("targets: rank-kill ratio <= 0.5; scale-up <= 5 s; node loss <= 10 s (2 s heartbeats)")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--inplace-only", action="store_true", help="only the SDK script's in-place cases")
    only.add_argument(
        "--plain-only", action="store_true", help="only the plain script's cases (and torchrun's rank kill)"
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep its logs (default: a temp dir)")
    parser.add_argument(
        "--c10d", action="store_true", help="also torchrun's c10d scale-up and node kill (comparison only)"
    )
    args = parser.parse_args()

    env = {
        "TRAINYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT),
        # The API is called in-process through DRF's test client, which names this host.
        "ALLOWED_HOSTS": "localhost,127.0.0.1,testserver",
        # Its controller and agents share one opted-in node token (a single-machine set-up).
        "TRAINYARD_NODE_TOKEN": os.environ.get("TRAINYARD_NODE_TOKEN") or secrets.token_urlsafe(32),
    }
    root = Path(args.keep) if args.keep else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=False)
    figures: dict[str, Any] = {}
    # The product's default warm pool (warm_pool=None), not the tests' smaller one.
    with harness.Bench("elastic", database=BENCH_DB, redis=BENCH_REDIS, env=env, root=root) as bench:
        from bench.elastic.trainyard import Trainyard

        print("Trainyard (controller + 3 agents, heartbeat 2 s)", flush=True)
        ty = Trainyard(bench)
        inplace: dict[str, list[float | None]] | None = None
        plain: dict[str, dict[str, list[float | None]]] | None = None
        try:
            if not args.inplace_only:
                plain = measure_plain_rank_kill(args.reps, ty, bench.root / "plain")
            if not args.plain_only:
                inplace = measure_inplace(args.reps, ty, bench.root / "inplace")
            if plain is not None:
                measure_plain_resizes(args.reps, ty, bench.root / "plain", plain)
        finally:
            ty.close()
        if plain is not None:
            if args.c10d:
                measure_torchrun_resizes(args.reps, plain, bench.root)
            figures.update(plain_figures(plain))
        if inplace is not None:
            print_inplace(inplace)
            figures.update(inplace_figures(inplace))
    harness.print_json(figures)
    return 0


if __name__ == "__main__":
    # SIGTERM and Ctrl-C unwind main(); every controller, agent and torchrun it started is
    # stopped on the way out, even one interrupted while the cluster was still starting.
    sys.exit(harness.run(main))
