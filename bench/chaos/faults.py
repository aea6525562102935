"""One fault at a time while the plain script trains, and what it did.

A case submits a job of tests/scripts/plain_ddp.py on three nodes (nnodes 2:3, one rank each),
waits until it trains at world 3, starts a client polling the API, injects the fault, waits
until the console is whole again (every component running, every node ONLINE), lets the job
train a few more steps, then asks it to finish (its finish file) and waits for the job's final
state. Then it reads the script's step logs, the database and the process table.

The rank-kill series kills a random rank every time the job has trained one checkpoint interval
plus a random part of another past its resume point, so each kill lands somewhere else in the
interval (right after a snapshot is written, too), and judges each kill on its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.console import COMPONENTS, Console, JobRun
from bench.chaos.infra import alive, marked_processes, wait_until
from bench.chaos.measure import (
    ApiPoller,
    Orphan,
    PointCount,
    check_sequence,
    compare_points,
    logged_steps,
    orphans,
    stored_metric_points,
    stored_step_lines,
    telemetry_drained,
    wait_stable,
)
from bench.chaos.supervised import SupervisedConsole

FAULTS = ("web", "controller", "ingest", "agent", "rank", "redis", "postgres")
DESCRIPTIONS = {
    "web": "SIGKILL web",
    "controller": "SIGKILL controller",
    "ingest": "SIGKILL ingest",
    "agent": "SIGKILL a non-rank-0 agent with its ranks",
    "rank": "SIGKILL a rank",
    "redis": "Redis restart",
    "postgres": "PostgreSQL restart (fast)",
    "rank-kills": "rank kills in a row",
}
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
KILL_CYCLE_GUESS = 10.0  # seconds per kill (recovery and a checkpoint interval) before one is measured
FINISH_RESERVE = 40.0  # seconds the series keeps for ending the job and measuring it
SCRIPT_NAME = "plain_ddp.py"


@dataclass
class Timing:
    """How long a case waits for each phase; the test uses shorter ones."""

    warmup_steps: int = 20  # at world 3 before the fault
    after_steps: int = 20  # after the console is whole again, before the job is asked to finish
    start_timeout: float = 180.0
    heal_timeout: float = 90.0
    finish_timeout: float = 60.0
    outage: float = 2.0  # seconds Redis / PostgreSQL stay down
    deadline: float = float("inf")  # time.monotonic() by which the run must be done
    kills_deadline: float = float("inf")  # by which the rank-kill series must be done

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def left_for_kills(self) -> float:
        return min(self.deadline, self.kills_deadline) - time.monotonic()


@dataclass
class KillResult:
    index: int
    rank: int
    at_step: int
    recovered_s: float | None
    redone: int | None
    problems: list[str]

    @property
    def clean(self) -> bool:
        return self.recovered_s is not None and not self.problems


@dataclass
class CaseResult:
    setup: str
    fault: str
    job_id: int = 0
    detail: str = ""
    state: str = ""
    recovered_s: float | None = None
    redone: int | None = None
    points: PointCount | None = None
    lines: PointCount | None = None
    orphans: list[Orphan] = field(default_factory=list)
    http_5xx: int = 0
    http_5xx_after_heal: int = 0  # answered once every component was back
    unanswered: int = 0
    requests: int = 0
    first_5xx: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kills: list[KillResult] = field(default_factory=list)
    seconds: float = 0.0
    skipped: bool = False
    console_gave_up: bool = False  # bin/run's supervisor stopped everything
    fault_time: float = 0.0
    victim_ranks: list[int] = field(default_factory=list)  # ranks the fault killed itself
    lost_point_times: list[float] = field(default_factory=list)  # when the script logged each lost point
    lost_line_times: list[float] = field(default_factory=list)  # the same for lost log lines

    @property
    def ran(self) -> bool:
        """False for a case the time budget left out."""
        return not self.skipped

    @property
    def ok(self) -> bool:
        return (
            self.state == "SUCCEEDED"
            and self.points is not None
            and self.points.lost == 0
            and self.points.duplicated == 0
            and not self.orphans
            and self.http_5xx == 0
            and not self.problems
            and all(k.clean for k in self.kills)
        )

    def figures(self) -> dict[str, Any]:
        if not self.ran:
            return {"skipped": True, "why": "; ".join(self.notes)}
        figures: dict[str, Any] = {
            "state": self.state,
            "recovered_s": None if self.recovered_s is None else round(self.recovered_s, 2),
            "steps_redone": self.redone,
            "lost_points": self.points.lost if self.points else None,
            "duplicated_points": self.points.duplicated if self.points else None,
            "lost_log_lines": self.lines.lost if self.lines else None,
            "duplicated_log_lines": self.lines.duplicated if self.lines else None,
            "orphans": len(self.orphans),
            "http_5xx": self.http_5xx,
            "sequence_clean": not self.problems,
        }
        if self.kills:
            figures["kills"] = len(self.kills)
            figures["rank_kills_clean"] = sum(k.clean for k in self.kills)
            recovered = sorted(k.recovered_s for k in self.kills if k.recovered_s is not None)
            if recovered:
                figures["recovered_s"] = round(recovered[len(recovered) // 2], 2)
                figures["recovered_s_range"] = [round(recovered[0], 2), round(recovered[-1], 2)]
        return figures


# --- waiting on the step log -------------------------------------------------------------------


def steps_after(run: JobRun, t: float, world: int | None = None) -> list[dict[str, Any]]:
    return [r for r in run.steps() if r["t"] > t and (world is None or r["world"] == world)]


def wait_steps(
    console: Console, run: JobRun, count: int, after: float, timeout: float, world: int | None = None
) -> bool:
    """Until rank 0 logged ``count`` steps after ``after`` (at ``world``); False on timeout, on a
    final job state or when the console gave up."""

    def done() -> bool:
        if len(steps_after(run, after, world)) >= count:
            return True
        return bool(console.problem()) or console.job_over(run.job_id)

    wait_until(done, timeout, 0.1)
    return len(steps_after(run, after, world)) >= count


def recovery(run: JobRun, t_fault: float) -> tuple[float | None, int | None]:
    """Seconds from the fault to the next step, and the most steps redone after it.

    When the processes that trained at the fault still train at the end, the fault did not stop
    training and the next step is simply the first one after it. Otherwise the fault ended them
    (a late step or two of theirs does not count) and the next step is the first one logged by a
    process started after the fault; None if there is none."""
    records = run.records()
    steps = [r for r in records if r.get("event") is None and "step" in r]
    after = [r for r in steps if r["t"] > t_fault]
    before_pids = {r["pid"] for r in steps if r["t"] <= t_fault}
    started_after = {r["pid"] for r in records if r.get("event") == "start" and r["t"] > t_fault}
    if after and after[-1]["pid"] in before_pids:
        chosen = after
    else:
        chosen = [r for r in after if r["pid"] in started_after]
    recovered = float(chosen[0]["t"] - t_fault) if chosen else None
    sequence = check_sequence(records, run.every)
    redone = [r.redone for r in sequence.resumes_between(t_fault, float("inf"))]
    return recovered, max(redone) if redone else 0


# --- injecting ---------------------------------------------------------------------------------


def victim_agent(console: Console, run: JobRun) -> tuple[str, int] | None:
    """A node of the job's round that is not rank 0, and its node rank: the supervisor's own
    agent in set-up (b) (so that bringing it back is the supervisor's job), node rank 1 in (a)."""
    members = {node_rank: console.node_of_rank(run.job_id, node_rank) for node_rank in (1, 2)}
    if isinstance(console, SupervisedConsole):
        for node_rank, name in members.items():
            if name == console.LOCAL_AGENT:
                return name, node_rank
    return (members[1], 1) if members[1] is not None else None


def kill_rank(run: JobRun, rank: int) -> int | None:
    pid = run.rank_pid(rank)
    if pid is None or not alive(pid):
        return None
    os.kill(pid, signal.SIGKILL)
    return pid


def inject(console: Console, run: JobRun, fault: str, timing: Timing, result: CaseResult) -> str:
    if fault in COMPONENTS:
        killed = console.kill(fault)
        return f"SIGKILL {fault}: {len(killed)} process(es)"
    if fault == "agent":
        victim = victim_agent(console, run)
        if victim is None:
            return "no non-rank-0 agent in the round"
        name, node_rank = victim
        result.victim_ranks = [node_rank]  # one rank per node
        killed = console.kill(name)
        return f"SIGKILL agent {name} (rank {node_rank}): {len(killed)} process(es)"
    if fault == "rank":
        result.victim_ranks = [1]
        pid = kill_rank(run, 1)
        return f"SIGKILL rank 1 (pid {pid})"
    if fault == "redis":
        return console.restart_redis(timing.outage)
    if fault == "postgres":
        console.restart_postgres(timing.outage)
        return f"pg_ctl stop -m fast, {timing.outage:.0f} s down, pg_ctl start"
    raise ValueError(f"unknown fault {fault!r}")


# --- one case ----------------------------------------------------------------------------------


def start_job(console: Console, tag: str, result: CaseResult, timing: Timing) -> JobRun | None:
    restarted = console.ensure_running()
    if restarted:
        result.notes.append(f"before the case, restarted: {', '.join(restarted)}")
    if not console.wait_online(timing.start_timeout):
        result.notes.append("not every agent was ONLINE before the case")
    run = console.submit(tag)
    result.job_id = run.job_id
    if not wait_steps(
        console, run, timing.warmup_steps, 0.0, timing.start_timeout, world=len(console.agent_names)
    ):
        result.state = console.job_state(run.job_id)[0]
        result.notes.append(f"never trained {timing.warmup_steps} steps at world {len(console.agent_names)}")
        return None
    return run


def finish_job(console: Console, run: JobRun, result: CaseResult, timing: Timing) -> None:
    """Ask the job to finish and wait for its final state; stop it if it never gets there."""
    run.finish()
    wait_until(
        lambda: console.job_state(run.job_id)[0] in TERMINAL or bool(console.problem()),
        timing.finish_timeout,
        0.2,
    )
    state = console.job_state(run.job_id)[0]
    problem = console.problem()
    if problem:
        result.console_gave_up = True
        if problem not in result.notes:
            result.notes.append(problem)
    if state not in TERMINAL:
        waited = (
            "with the console down" if problem else f"{timing.finish_timeout:.0f} s after the finish file"
        )
        result.notes.append(f"no final state {waited}; the bench stopped the job")
        with contextlib.suppress(Exception):
            console.ensure_running()
            console.stop_job(run.job_id)
    result.state = state


def measure(console: Console, run: JobRun, result: CaseResult) -> None:
    """Step sequence, points and log lines against the database, orphans."""
    sequence = check_sequence(run.records(), run.every)
    result.problems = [p.text for p in sequence.problems]
    expected = logged_steps(run.rank_logs())
    duplicated_in_log = [key for key, count in expected.items() if count > 1]
    if duplicated_in_log:
        result.problems.append(f"the script logged {len(duplicated_in_log)} (round, rank, step) twice")

    def stored_points() -> int:
        with console.db() as conn:
            return sum(stored_metric_points(conn, run.job_id).values())

    wait_stable(stored_points, len(expected))
    # A point stored twice would come from an entry ingest has yet to read or ack: the counts are
    # read once it has none left (not after a quiet spell).
    wait_until(lambda: telemetry_drained(console.redis_url), 30, 0.2)
    with console.db() as conn:
        result.points = compare_points(expected, stored_metric_points(conn, run.job_id))
        result.lines = compare_points(expected, stored_step_lines(conn, run.job_id))
    logged_at = {
        (int(r["round"]), int(r["rank"]), int(r["step"])): float(r["t"])
        for records in run.rank_logs()
        for r in records
        if r.get("event") is None and "step" in r
    }
    result.lost_point_times = [logged_at[key] for key in result.points.lost_keys if key in logged_at]
    result.lost_line_times = [logged_at[key] for key in result.lines.lost_keys if key in logged_at]
    # Ranks of a finished job should be gone within the agents' stop grace period.
    owners = console.owners()
    wait_until(lambda: not orphans(console.run_id, owners, SCRIPT_NAME, set()), 10, 0.5)
    result.orphans = orphans(console.run_id, console.owners(), SCRIPT_NAME, set())
    for orphan in result.orphans:  # the next case starts clean
        with contextlib.suppress(OSError):
            os.kill(orphan.pid, signal.SIGKILL)


def run_case(console: Console, fault: str, timing: Timing) -> CaseResult:
    started = time.monotonic()
    result = CaseResult(console.kind, fault)
    events = len(console.events)
    run = start_job(console, fault, result, timing)
    if run is None:
        result.seconds = time.monotonic() - started
        return result
    poller = ApiPoller(console.api_url, console.token, run.job_id)
    poller.start()
    t_fault = healed_at = time.time()
    gave_up = False
    try:
        marked_processes(console.run_id)  # what runs now stays known if the fault orphans it
        result.fault_time = time.time()
        result.detail = inject(console, run, fault, timing, result)
        healed = wait_until(lambda: console.healthy() or bool(console.problem()), timing.heal_timeout, 0.5)
        healed_at = time.time()
        if not healed or console.problem():
            result.notes.append(
                console.problem() or f"console not whole {timing.heal_timeout:.0f} s after the fault"
            )
        else:
            wait_steps(console, run, timing.after_steps, time.time(), timing.heal_timeout)
        gave_up = bool(console.problem())
        finish_job(console, run, result, timing)
    finally:
        poller.stop()
    result.http_5xx, result.unanswered, result.requests = poller.http_5xx, poller.unanswered, poller.requests
    result.http_5xx_after_heal = sum(1 for t in poller.times_5xx if t > healed_at)
    result.first_5xx = poller.first_5xx
    result.recovered_s, result.redone = recovery(run, t_fault)
    if gave_up or result.console_gave_up:
        result.recovered_s = None  # what trained after the fault were ranks the console had lost
    result.notes.extend(console.events[events:])
    measure(console, run, result)
    result.seconds = time.monotonic() - started
    return result


# --- the rank-kill series ----------------------------------------------------------------------


def resumed_after(run: JobRun, t: float) -> bool:
    """A rank 0 started after ``t`` has logged a step."""
    records = run.records()
    starts = [r for r in records if r.get("event") == "start" and r["t"] > t]
    if not starts:
        return False
    pid = starts[-1]["pid"]
    return any(r.get("event") is None and "step" in r and r["pid"] == pid for r in records)


def current_start(run: JobRun) -> dict[str, Any] | None:
    starts = [r for r in run.records() if r.get("event") == "start"]
    return starts[-1] if starts else None


def run_rank_kills(console: Console, kills: int, timing: Timing, seed: int = 11) -> CaseResult:
    started = time.monotonic()
    rng = random.Random(seed)
    result = CaseResult(console.kind, "rank-kills")
    if timing.left_for_kills() < KILL_CYCLE_GUESS + FINISH_RESERVE:
        result.notes.append(f"not started: out of the time budget (0 of {kills} kills)")
        result.skipped = True
        return result
    events = len(console.events)
    run = start_job(console, "rank-kills", result, timing)
    if run is None:
        result.seconds = time.monotonic() - started
        return result
    world = len(console.agent_names)
    poller = ApiPoller(console.api_url, console.token, run.job_id)
    poller.start()
    kill_times: list[float] = []
    cycle_started = time.monotonic()
    cycles: list[float] = []
    try:
        for index in range(kills):
            expected = statistics.median(cycles) if cycles else KILL_CYCLE_GUESS
            if timing.left_for_kills() < expected + FINISH_RESERVE:
                result.notes.append(f"stopped after {index} of {kills} kills: out of the time budget")
                break
            start = current_start(run)
            assert start is not None
            target = int(start["resume_step"]) + run.every + rng.randrange(run.every)
            reached = wait_until(
                lambda target=target, pid=start["pid"]: (
                    any(  # type: ignore[misc]
                        r["step"] >= target and r["pid"] == pid for r in run.steps()
                    )
                    or console.job_over(run.job_id)
                ),
                timing.heal_timeout,
                0.02,
            )
            if not reached or console.job_over(run.job_id, max_age=0):
                result.notes.append(f"kill {index + 1}: the job stopped training before step {target}")
                break
            rank = rng.randrange(world)
            at_step = run.steps()[-1]["step"]
            t_kill = time.time()
            if kill_rank(run, rank) is None:
                result.notes.append(f"kill {index + 1}: rank {rank} was not running")
                break
            kill_times.append(t_kill)
            wait_until(lambda t_kill=t_kill: resumed_after(run, t_kill), timing.heal_timeout, 0.05)  # type: ignore[misc]
            recovered, _ = recovery(run, t_kill)
            result.kills.append(KillResult(index + 1, rank, int(at_step), recovered, None, []))
            cycles.append(time.monotonic() - cycle_started)
            cycle_started = time.monotonic()
        finish_job(console, run, result, timing)
    finally:
        poller.stop()
    result.http_5xx, result.unanswered, result.requests = poller.http_5xx, poller.unanswered, poller.requests
    result.first_5xx = poller.first_5xx
    sequence = check_sequence(run.records(), run.every)
    bounds = [*kill_times, float("inf")]
    for kill, (begin, end) in zip(result.kills, itertools.pairwise(bounds), strict=False):
        kill.problems = [p.text for p in sequence.problems_between(begin, end)]
        redone = [r.redone for r in sequence.resumes_between(begin, end)]
        kill.redone = max(redone) if redone else None
    result.notes.extend(console.events[events:])
    measure(console, run, result)
    times = sorted(k.recovered_s for k in result.kills if k.recovered_s is not None)
    result.recovered_s = times[len(times) // 2] if times else None
    redone_all = [k.redone for k in result.kills if k.redone is not None]
    result.redone = max(redone_all) if redone_all else None
    result.seconds = time.monotonic() - started
    return result
