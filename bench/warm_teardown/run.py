"""Warm ranks' teardown: how often a two-rank gloo DDP run hangs at its end, by warm preload.

    .venv/bin/python bench/warm_teardown/run.py [--runs 30] [--hang-after 25] [--keep DIR]

Each run starts two ranks of tests/scripts/plain_ddp.py (DDP, a DataLoader worker, a snapshot
every 5 steps, 30 steps) through bench/warm_teardown/rank.py, which imports what a warm
interpreter imports (workers/agent/warm.py ``preload``, then ``freeze_heap``) and then runs the
script as ``__main__``. A run whose ranks have not both exited ``--hang-after`` seconds after the
start (they take 3-6 s) counts as hung; its ranks are SIGKILLed (with py-spy on the PATH, their
stacks are saved first, in ``--keep``'s run directory). Variants, run by run in turn so that they
share the machine's load:

- ``guarded``: the preload as shipped: torch._dynamo imported, backward's contextvars copy kept
  out of torch's TLS until something is compiled (``keep_backward_context_out_of_collectives``),
  and a GIL-free pause before destroy_process_group (``let_gloo_workers_finish_before_destroy``).
- ``unguarded``: the same imports with torch's own stash and destroy: a gloo worker thread that
  frees a finished work holding a Python object needs the GIL, while DDP's Reducer or the
  group's destructor joins it with the GIL held.
- ``lean``: the preload before torch._dynamo was in it (the script imports dynamo itself later).

A run whose rank ends with another code than 0 counts as crashed: torch 2.13's other teardown bug
(README, "Two torch 2.13 bugs"), a gloo worker freeing a work whose thread-local state holds a
Python object while the interpreter finalizes (SIGABRT or SIGSEGV), has the same cause.
Ends with one JSON line: ``teardown_hangs_<variant>``, ``teardown_crashes_<variant>`` (runs) and
``runs_each``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import harness  # noqa: E402
from tests.support import procs  # noqa: E402
from workers.net import free_port  # noqa: E402

RANK = Path(__file__).resolve().parent / "rank.py"
VARIANTS = ("guarded", "unguarded", "lean")
STEPS = 30


def one_run(variant: str, work: Path, hang_after: float, end: str) -> tuple[str, float]:
    """("ok" | "hung" | "crashed", seconds to the end of both ranks or to the hang verdict).
    Crashed: a rank ended with another code than 0 (the teardown's SIGABRT or SIGSEGV)."""
    work.mkdir(parents=True)
    port = free_port()
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "WARM_TEARDOWN_VARIANT": variant,
        }
        steps = STEPS if end == "steps" else 100000
        args = ["--steps", str(steps), "--checkpoint-every", "5", "--checkpoint-dir", str(work / "ckpt")]
        args += ["--step-log", str(work / "steps.jsonl")]
        ranks.append(procs.spawn([sys.executable, str(RANK), *args], env=env, log=work / f"rank{rank}.log"))
    started = time.monotonic()
    if end == "stop":  # as the agent stops a round: SIGTERM to each rank's interpreter
        log = work / "steps.jsonl"
        while time.monotonic() < started + hang_after and not (
            log.exists() and log.read_text().count("\n") > STEPS
        ):
            time.sleep(0.05)
        for p in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        started = time.monotonic()
    deadline = started + hang_after
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(0.05)
    took = time.monotonic() - started
    hung = [p for p in ranks if p.poll() is None]
    spy = shutil.which("py-spy") or (str(Path(sys.executable).parent / "py-spy"))
    for p in hung:
        if Path(spy).exists():
            with (work / f"py-spy-{p.pid}.txt").open("w") as out:
                subprocess.run(
                    [spy, "dump", "--native", "--pid", str(p.pid)], stdout=out, stderr=out, timeout=30
                )
    codes = [p.poll() for p in ranks]
    for p in ranks:
        procs.kill(p)
    if hung:
        return "hung", took
    return ("ok" if codes == [0, 0] else "crashed"), took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="runs of each variant")
    parser.add_argument("--hang-after", type=float, default=25.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep its logs")
    parser.add_argument(
        "--end",
        choices=("stop", "steps"),
        default="stop",
        help="stop: SIGTERM once the ranks trained, as the agent stops a round (default); steps: the run ends",
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="bench-warm-teardown-") as temp:
        root = Path(args.keep) if args.keep else Path(temp)
        root.mkdir(parents=True, exist_ok=True)
        hung = {v: 0 for v in variants}
        crashed = {v: 0 for v in variants}
        times: dict[str, list[float]] = {v: [] for v in variants}
        for run in range(args.runs):
            for variant in variants:
                verdict, took = one_run(variant, root / f"{variant}-{run}", args.hang_after, args.end)
                hung[variant] += verdict == "hung"
                crashed[variant] += verdict == "crashed"
                if verdict != "hung":
                    times[variant].append(took)
                shown = f"{took:.1f} s" if verdict == "ok" else verdict.upper()
                print(f"  run {run + 1:>3} {variant:<10} {shown}", flush=True)
    print()
    print(f"{'variant':<10} {'runs':>5} {'hung':>5} {'crashed':>8} {'median run':>11}")
    for variant in variants:
        ok = sorted(times[variant])
        median = f"{ok[len(ok) // 2]:.1f} s" if ok else "-"
        print(f"{variant:<10} {args.runs:>5} {hung[variant]:>5} {crashed[variant]:>8} {median:>11}")
    figures: dict[str, int] = {f"teardown_hangs_{v}": hung[v] for v in variants}
    figures.update({f"teardown_crashes_{v}": crashed[v] for v in variants})
    figures["runs_each"] = args.runs
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    # SIGINT and SIGTERM unwind main(): both ranks of a run are stopped on the way out.
    sys.exit(harness.run(main))
