"""Chaos bench: one fault at a time while a plain torchrun-style DDP script trains.

    .venv/bin/python bench/chaos/run.py [--setups compose,supervised] [--kills 50] [--faults web,rank]

The script is tests/scripts/plain_ddp.py (DDP, a DataLoader with a DistributedSampler, a
``torch.save`` snapshot every 10 steps, resumes from the latest; every rank appends one JSON
line per step), run on three nodes (nnodes 2:3, one rank each) of a console with its own
PostgreSQL cluster and Redis, in two set-ups (bench/chaos/console.py):

- compose: web, controller, ingest and three agents each on its own, as docker-compose runs
  them; a SIGKILLed component goes down with its processes and is started again at once;
- supervised: ``manage.py up`` (bin/run) and two more agents; a SIGKILLed child is the
  supervisor's to bring back.

Faults, one per job: SIGKILL of web, controller, ingest, a non-rank-0 agent (with its ranks in
compose, as a container dies; alone in supervised, where the agent's reaper must stop them), a
rank; a Redis restart (SIGTERM, 2 s down, start); a PostgreSQL restart (pg_ctl stop -m fast, 2 s
down, start); then, in the compose set-up, ``--kills`` rank kills in a row on one job.

For each: the job's final state, seconds from the fault to the next step, steps redone past the
last snapshot, metric points lost and duplicated (the script sends each step's loss through
``workers.sdk.log`` and flushes it before writing its own line, so its log says exactly which
points the database should hold, per round, rank and step), the same for its stdout step lines
(the console's log lines: what a script without the SDK gets), orphan processes, and 5xx
answers seen by a client polling the API from the fault to the job's end. Ends with one JSON line.

Every process the bench starts carries a mark in its environment; whatever is left at the end
(or on SIGINT, SIGTERM or an exception) is killed by pid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.chaos.console import ComposeConsole, Console  # noqa: E402
from bench.chaos.faults import DESCRIPTIONS, FAULTS, CaseResult, Timing, run_case, run_rank_kills  # noqa: E402
from bench.chaos.infra import sweep  # noqa: E402
from bench.chaos.supervised import SupervisedConsole  # noqa: E402

SETUPS: dict[str, type[Console]] = {"compose": ComposeConsole, "supervised": SupervisedConsole}
"""In the order they run. Single faults come first in both; the compose set-up's rank-kill series
takes what is left of the time budget once SUPERVISED_RESERVE is kept for the supervised set-up."""
SUPERVISED_RESERVE = 240.0  # seconds: start-up and seven faults of about 25 s on a quiet machine
CASE_MINIMUM = 60.0  # seconds a single fault needs at least; with less left it is skipped
CLOSE_RESERVE = 45.0  # seconds kept for stopping the last set-up


class Interrupted(Exception):
    pass


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setups", default="compose,supervised", help="compose, supervised or both")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"any of {', '.join(FAULTS)}")
    parser.add_argument(
        "--kills", type=int, default=50, help="rank kills in a row (compose set-up); 0 = none"
    )
    parser.add_argument("--outage", type=float, default=2.0, help="seconds Redis and PostgreSQL stay down")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--budget",
        type=float,
        default=570.0,
        help="seconds for the whole run; the rank-kill series stops early (and says so) to keep it",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, step logs)")
    return parser.parse_args(argv)


# --- output ------------------------------------------------------------------------------------

COLUMNS = [
    ("set-up", 10),
    ("fault", 34),
    ("job", 10),
    ("next step s", 11),
    ("redone", 6),
    ("points lost/dup", 15),
    ("lines lost/dup", 14),
    ("orphans", 7),
    ("5xx", 5),
    ("sequence", 9),
]


def _pair(count: Any) -> str:
    return "-" if count is None else f"{count.lost}/{count.duplicated}"


def row(result: CaseResult) -> str:
    name = DESCRIPTIONS[result.fault]
    if not result.ran:
        cells = [result.setup, name, "skipped", *(["-"] * (len(COLUMNS) - 3))]
        return "  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True))
    if result.kills:
        name = f"{len(result.kills)} {name}"
    recovered = "-" if result.recovered_s is None else f"{result.recovered_s:.2f}"
    if result.kills:
        values = sorted(k.recovered_s for k in result.kills if k.recovered_s is not None)
        if values:
            recovered = f"{recovered} ({values[0]:.1f}-{values[-1]:.1f})"
        sequence = f"{sum(k.clean for k in result.kills)}/{len(result.kills)}"
    else:
        sequence = "clean" if not result.problems else "BROKEN"
    cells = [
        result.setup,
        name,
        result.state or "-",
        recovered,
        "-" if result.redone is None else str(result.redone),
        _pair(result.points),
        _pair(result.lines),
        str(len(result.orphans)),
        str(result.http_5xx),
        sequence,
    ]
    return "  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True))


def header() -> str:
    line = "  ".join(title.ljust(width) for title, width in COLUMNS)
    return f"{line}\n{'-' * len(line)}"


def details(result: CaseResult) -> list[str]:
    lines = []
    if result.detail:
        lines.append(f"    fault: {result.detail}")
    for note in result.notes:
        lines.append(f"    note: {note}")
    if result.first_5xx:
        first = " ".join(result.first_5xx.split())[:160]
        lines.append(
            f"    5xx: {result.http_5xx} ({result.http_5xx_after_heal} after every component was back); first: {first}"
        )
    if result.unanswered:
        lines.append(
            f"    API requests unanswered (connection refused or timed out): {result.unanswered}/{result.requests}"
        )
    for problem in result.problems[:5]:
        lines.append(f"    sequence: {problem}")
    for orphan in result.orphans[:5]:
        lines.append(f"    orphan: {orphan}")
    for label, count in (("points", result.points), ("log lines", result.lines)):
        if count is not None and count.lost_keys:
            shown = ", ".join(f"r{r}/rank {k}/step {s}" for r, k, s in count.lost_keys[:6])
            lines.append(
                f"    {label} lost (round/rank/step): {shown}{' ...' if len(count.lost_keys) > 6 else ''}"
            )
    if result.points is not None and result.points.unlogged:
        lines.append(f"    points stored but not in the script's log: {result.points.unlogged}")
    return lines


def summary(results: list[CaseResult], seconds: float, kills_asked: int) -> dict[str, Any]:
    faults = {f"{r.setup}/{r.fault}": r.figures() for r in results}
    kills = [k for r in results for k in r.kills]
    return {
        "faults": faults,
        "lost_points_total": sum(r.points.lost for r in results if r.points),
        "duplicated_points_total": sum(r.points.duplicated for r in results if r.points),
        "orphans_total": sum(len(r.orphans) for r in results),
        "http_5xx_total": sum(r.http_5xx for r in results),
        "rank_kills_clean": sum(k.clean for k in kills),
        "rank_kills": len(kills),
        "rank_kills_asked": kills_asked,
        "jobs_succeeded": sum(r.state == "SUCCEEDED" for r in results),
        "jobs": sum(r.ran for r in results),
        "skipped": [f"{r.setup}/{r.fault}" for r in results if not r.ran],
        "seconds": round(seconds, 1),
    }


# --- running -----------------------------------------------------------------------------------


def run_setup(
    console: Console, faults: list[str], kills: int, timing: Timing, seed: int, results: list[CaseResult]
) -> None:
    started = time.monotonic()
    console.start()
    print(f"[{console.kind}] console up in {time.monotonic() - started:.0f} s", flush=True)
    cases: list[str] = [*faults, *(["rank-kills"] if kills else [])]
    for fault in cases:
        if fault != "rank-kills" and timing.left() < CASE_MINIMUM:
            results.append(
                CaseResult(console.kind, fault, notes=["skipped: out of the time budget"], skipped=True)
            )
            print(f"[{console.kind}] {DESCRIPTIONS[fault]}: skipped, out of the time budget", flush=True)
            continue
        try:
            if fault == "rank-kills":
                result = run_rank_kills(console, kills, timing, seed)
            else:
                result = run_case(console, fault, timing)
        except Interrupted:
            raise
        except Exception as exc:
            result = CaseResult(console.kind, fault, notes=[f"the case failed: {exc!r}"])
            traceback.print_exc()
        results.append(result)
        print(f"[{console.kind}] {row(result)}  ({result.seconds:.0f} s)", flush=True)
        for line in details(result):
            print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    wanted = [s.strip() for s in args.setups.split(",") if s.strip()]
    setups = [name for name in SETUPS if name in wanted] + [s for s in wanted if s not in SETUPS]
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [s for s in setups if s not in SETUPS] + [f for f in faults if f not in FAULTS]
    if unknown:
        print(f"unknown set-up or fault: {', '.join(unknown)}", file=sys.stderr)
        return 2
    run_id = uuid.uuid4().hex[:12]
    root = Path(tempfile.mkdtemp(prefix="trainyard-chaos-"))
    root.chmod(0o755)  # PostgreSQL runs as its own user and must reach its directory
    print(f"chaos run {run_id} in {root}", flush=True)
    timing = Timing(outage=args.outage, deadline=time.monotonic() + args.budget - CLOSE_RESERVE)
    results: list[CaseResult] = []
    started = time.monotonic()
    code = 0
    try:
        for name in setups:
            console = SETUPS[name](root / name, run_id)
            reserve = SUPERVISED_RESERVE if name == "compose" and "supervised" in setups else 0.0
            own = dataclasses.replace(timing, kills_deadline=timing.deadline - reserve)
            try:
                run_setup(console, faults, args.kills if name == "compose" else 0, own, args.seed, results)
            finally:
                # Stop as politely as each process allows, then kill whatever is left by pid.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                try:
                    console.close()
                except Exception:
                    traceback.print_exc()
                left = sweep(run_id)
                if left:
                    print(f"[{name}] killed {len(left)} process(es) left after stopping: {left}", flush=True)
                signal.signal(signal.SIGTERM, on_signal)
                signal.signal(signal.SIGINT, on_signal)
    except Interrupted as exc:
        print(f"interrupted by {exc}; every process of the run was stopped", flush=True)
        code = 130
    except Exception:
        traceback.print_exc()
        print("the run failed; every process of the run was stopped", flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sweep(run_id)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    print()
    print(header())
    for result in results:
        print(row(result))
    print()
    kills_asked = args.kills if "compose" in setups else 0
    print(json.dumps(summary(results, time.monotonic() - started, kills_asked)))
    return code


if __name__ == "__main__":
    sys.exit(main())
