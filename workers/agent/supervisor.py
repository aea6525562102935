"""Supervision of the rank processes: one loop on one thread of the agent's main process.

Celery tasks never touch processes; they hand a command (start round, stop job, sync, shut
down) to this loop and return, so the node queue is never blocked by a grace period. Each tick
the loop takes the commands, then monitors (polls every rank; SUPERVISE_INTERVAL_SECONDS keeps
an exit noticed well within a second), decides (rank exits, round outcomes, stop deadlines) and
acts (signals, launches, messages to the controller).

Per job the host runs at most one round. A newer round first stops the running one (SIGTERM to
each rank's process group, the round's grace period, then SIGKILL) and starts once every rank
of the old one has ended. Commands for a round older than the newest seen for the job are
ignored (fencing); the newest round per job is kept in ``<data-dir>/fencing.json`` so a command
redelivered after an agent restart cannot bring an old round back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from workers import protocol
from workers.agent.config import AgentConfig
from workers.agent.control import ControlClient
from workers.agent.launcher import (
    LaunchError,
    RankFiles,
    RankHandler,
    carried_ranks,
    fetch_bundle,
    global_rank,
    rank_command,
    rank_env,
    regroup,
    removed,
    start_rank,
    survivable,
    write_rank_control,
)
from workers.agent.reaper import ENV_AGENT_SESSION, ReaperClient
from workers.agent.retention import prune_rounds
from workers.agent.shipper import TelemetryShipper
from workers.agent.warmpool import WarmPool
from workers.protocol import RankExit, RankState, RankStatus, RoundSpec, RoundState, RoundStatus
from workers.sdk.elastic import FAILED, FORMED, LEFT, read_state

logger = logging.getLogger(__name__)

SUPERVISE_INTERVAL_SECONDS = 0.1
DEFAULT_GRACE_PERIOD_SECONDS = 30.0
STDERR_TAIL_LINES = 30
STDERR_TAIL_BYTES = 16_384
PRUNE_INTERVAL_SECONDS = 3600.0
TEARDOWN_CHECK_INTERVAL_SECONDS = 1.0


@dataclass(frozen=True)
class StartRound:
    spec: RoundSpec


@dataclass(frozen=True)
class StopJob:
    job_id: int
    round: int
    grace_period: float


@dataclass(frozen=True)
class Sync:
    rounds: list[RoundSpec]


@dataclass(frozen=True)
class Shutdown:
    pass


Command = StartRound | StopJob | Sync | Shutdown


@dataclass
class Rank:
    local_rank: int
    rank: int
    files: RankFiles
    handler: RankHandler
    state: RankState = RankState.RUNNING
    killed_in_teardown: bool = False
    origin_round: int = -1  # the round it was started for (its files live there)

    @property
    def pid(self) -> int:
        return self.handler.proc.pid


@dataclass
class LocalRound:
    spec: RoundSpec
    state: RoundState = RoundState.STARTING
    ranks: list[Rank] = field(default_factory=list)
    preparing: Future[Path | None] | None = None
    stop_reason: Literal["", "command", "failure"] = ""
    stop_deadline: float = 0.0
    killed: bool = False
    failures: list[RankExit] = field(default_factory=list)

    @property
    def job_id(self) -> int:
        return self.spec["job_id"]

    @property
    def number(self) -> int:
        return self.spec["round"]

    @property
    def ended(self) -> bool:
        return self.state.is_final


@dataclass
class JobSlot:
    newest: int = -1  # newest round any command named
    fenced_upto: int = -1  # rounds up to this one were stopped and must not start again
    active: LocalRound | None = None  # starting, running or stopping
    pending: RoundSpec | None = None  # starts once `active` has fully stopped
    last_ended: LocalRound | None = None

    def held_rounds(self) -> list[int]:
        """The rounds this host still holds for the job: active, last ended, pending, and those
        whose directories hold the files of ranks carried into the active round."""
        held = [local.number for local in (self.active, self.last_ended) if local is not None]
        if self.active is not None:
            held += sorted({r.origin_round for r in self.active.ranks if r.origin_round >= 0} - set(held))
        if self.pending is not None:
            held.append(self.pending["round"])
        return held


def signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def stderr_tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - STDERR_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def error_message(rank: Rank, returncode: int) -> str:
    """The rank's @record error file (message and traceback) or, without one, its last stderr
    lines."""
    if rank.files.error_file.is_file():
        try:
            failure = ProcessFailure(
                local_rank=rank.local_rank,
                pid=rank.pid,
                exitcode=returncode,
                error_file=str(rank.files.error_file),
            )
            data = failure.error_file_data.get("message")
            if isinstance(data, dict):
                callstack = data.get("extraInfo", {}).get("py_callstack", "")
                return str(callstack or data.get("message", "")) or failure.message
            return failure.message
        except Exception:
            logger.warning("unreadable error file %s", rank.files.error_file)
    return stderr_tail(rank.files.stderr)


def code_ending(files: RankFiles) -> int | None:
    """The exit status the rank's Python code ended with, as runner.py recorded it before the
    interpreter's teardown; None when it recorded nothing (the code has not ended, was not run
    by the runner, or ended by a signal)."""
    try:
        status = json.loads(files.end_file.read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if isinstance(status, int) else None


def seconds_since_code_ended(files: RankFiles) -> float | None:
    try:
        return time.time() - files.end_file.stat().st_mtime
    except OSError:
        return None


def inplace_state(local: LocalRound) -> tuple[str, str, float | None]:
    """An in-place round's progress on this host, from its ranks' SDK state files: "formed" (and
    when the last rank formed) once every local rank formed the round's group, "failed" (with the
    reason) when one could not, else "pending"."""
    states = [read_state(rank.files.control) for rank in local.ranks]
    for state in states:
        if state is not None and state.get("round") == local.number and state.get("state") == FAILED:
            return protocol.INPLACE_FAILED, str(state.get("reason", "")), None
    if states and all(
        state is not None and state.get("round") == local.number and state.get("state") in (FORMED, LEFT)
        for state in states
    ):
        times = [float(state.get("time", 0.0)) for state in states if state is not None]
        return protocol.INPLACE_FORMED, "", max(times, default=None)
    return protocol.INPLACE_PENDING, "", None


def _killpg(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class Supervisor(threading.Thread):
    def __init__(
        self,
        config: AgentConfig,
        session: str,
        control: ControlClient,
        shipper: TelemetryShipper,
        reaper: ReaperClient,
        pool: WarmPool | None = None,
    ) -> None:
        super().__init__(name="supervisor", daemon=True)
        self._pool = pool
        self._config = config
        self._session = session
        self._control = control
        self._shipper = shipper
        self._reaper = reaper
        self._commands: queue.Queue[Command] = queue.Queue()
        self._lock = threading.Lock()
        self._jobs: dict[int, JobSlot] = {}
        self._preparer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        self._shutting_down = False
        self._fencing_file = config.data_dir / "fencing.json"
        self._load_fencing()
        self._pruning: Future[list[Path]] | None = None
        self._next_prune = 0.0  # monotonic
        self._next_teardown_check = 0.0  # monotonic

    # --- API for tasks and the agent ---------------------------------------------------------
    def submit(self, command: Command) -> None:
        self._commands.put(command)

    def statuses(self) -> list[RoundStatus]:
        with self._lock:
            rounds = [
                local
                for slot in self._jobs.values()
                for local in (slot.active, slot.last_ended)
                if local is not None
            ]
            statuses = []
            for local in rounds:
                progress = self._shipper.progress(local.job_id, local.number)
                status = RoundStatus(
                    job_id=local.job_id,
                    round=local.number,
                    state=local.state,
                    ranks=[
                        RankStatus(local_rank=r.local_rank, rank=r.rank, pid=r.pid, state=r.state)
                        for r in local.ranks
                    ],
                    last_step=progress.last_step,
                    first_step_at=progress.first_step_at,
                )
                if "carry_over" in local.spec:
                    status["inplace"], status["inplace_reason"], formed_at = inplace_state(local)
                    if formed_at:
                        status["inplace_formed_at"] = formed_at
                statuses.append(status)
            return statuses

    def shutdown(self, timeout: float) -> None:
        """Stops every round gracefully and waits for the loop to finish."""
        self.submit(Shutdown())
        self.join(timeout)
        if self.is_alive():
            logger.error("supervisor did not stop within %.0f s", timeout)

    def longest_grace(self) -> float:
        with self._lock:
            graces = [
                slot.active.spec.get("grace_period") or DEFAULT_GRACE_PERIOD_SECONDS
                for slot in self._jobs.values()
                if slot.active is not None
            ]
        return max(graces, default=0.0)

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            try:
                command: Command | None = self._commands.get(timeout=SUPERVISE_INTERVAL_SECONDS)
            except queue.Empty:
                command = None
            with self._lock:
                try:
                    while command is not None:
                        self._apply(command)
                        command = self._commands.get_nowait()
                except queue.Empty:
                    pass
                try:
                    self._supervise()
                    if time.monotonic() >= self._next_prune:
                        self._prune()
                except Exception:
                    logger.exception("supervision tick failed")
                if self._shutting_down and all(slot.active is None for slot in self._jobs.values()):
                    break
        self._preparer.shutdown(wait=False, cancel_futures=True)

    # --- commands ----------------------------------------------------------------------------
    def _apply(self, command: Command) -> None:
        if isinstance(command, StartRound):
            self._start(command.spec)
        elif isinstance(command, StopJob):
            self._stop_job(command.job_id, command.round, command.grace_period)
        elif isinstance(command, Sync):
            self._sync(command.rounds)
        elif isinstance(command, Shutdown):
            self._shutting_down = True
            for slot in self._jobs.values():
                slot.pending = None
                if slot.active is not None:
                    self._begin_stop(slot.active, self._grace(slot.active.spec), "command")

    def _slot(self, job_id: int) -> JobSlot:
        return self._jobs.setdefault(job_id, JobSlot())

    def _start(self, spec: RoundSpec) -> None:
        if self._shutting_down:
            return
        slot = self._slot(spec["job_id"])
        number = spec["round"]
        if number < slot.newest or number <= slot.fenced_upto:
            logger.info(
                "ignoring start of job %s round %s: round %s is newer", spec["job_id"], number, slot.newest
            )
            return
        if number in slot.held_rounds():
            if slot.active is not None and slot.active.number == number and "ps" in spec:
                self._regroup(slot.active, spec)  # or a parameter-server round's workers resized
            return  # a repeated command (redelivery, sync) for the round already here
        slot.newest = number
        self._save_fencing()
        if self._carry_over(slot, spec):
            return
        if slot.active is not None:
            logger.info(
                "job %s: stopping round %s before round %s", spec["job_id"], slot.active.number, number
            )
            self._begin_stop(slot.active, self._grace(slot.active.spec), "command")
            slot.pending = spec
            return
        self._launch(slot, spec)

    def _stop_job(self, job_id: int, number: int, grace: float) -> None:
        slot = self._slot(job_id)
        slot.newest = max(slot.newest, number)
        slot.fenced_upto = max(slot.fenced_upto, number)
        self._save_fencing()
        if slot.pending is not None and slot.pending["round"] <= number:
            slot.pending = None
        if slot.active is not None and slot.active.number <= number:
            self._begin_stop(slot.active, grace, "command")

    def _sync(self, rounds: list[RoundSpec]) -> None:
        wanted = {(spec["job_id"], spec["round"]) for spec in rounds}
        for job_id, slot in self._jobs.items():
            if slot.pending is not None and (job_id, slot.pending["round"]) not in wanted:
                slot.pending = None
            if slot.active is not None and (job_id, slot.active.number) not in wanted:
                slot.fenced_upto = max(slot.fenced_upto, slot.active.number)
                self._begin_stop(slot.active, self._grace(slot.active.spec), "command")
        self._save_fencing()
        for spec in rounds:
            self._start(spec)

    @staticmethod
    def _grace(spec: RoundSpec) -> float:
        grace = spec.get("grace_period")
        return float(grace) if grace is not None and grace >= 0 else DEFAULT_GRACE_PERIOD_SECONDS

    # --- acting ------------------------------------------------------------------------------
    def _launch(self, slot: JobSlot, spec: RoundSpec) -> None:
        local = LocalRound(spec=spec)
        slot.active = local
        if spec["bundle"]:
            local.preparing = self._preparer.submit(fetch_bundle, self._config, spec)
        else:
            self._spawn(local, None)

    def _spawn(self, local: LocalRound, bundle_dir: Path | None) -> None:
        spec = local.spec
        try:
            self._config.checkpoint_dir(spec["run_id"]).mkdir(parents=True, exist_ok=True)
            if self._pool is not None:
                self._pool.hold(spec["nproc_per_node"])
            starts = [
                self._spawn_rank(local, bundle_dir, i)
                for i in range(spec["nproc_per_node"])
                if not removed(spec, i)  # a resized round sent again (sync, agent restart)
            ]
        except (LaunchError, OSError) as exc:
            logger.error("job %s round %s cannot start: %s", spec["job_id"], spec["round"], exc)
            self._fail_launch(local, str(exc))
            return
        local.state = RoundState.RUNNING
        logger.info(
            "job %s round %s: started ranks %s (pids %s, %s)",
            spec["job_id"],
            spec["round"],
            [r.rank for r in local.ranks],
            [r.pid for r in local.ranks],
            starts,
        )

    def _spawn_rank(self, local: LocalRound, bundle_dir: Path | None, local_rank: int) -> str:
        spec = local.spec
        files = RankFiles.for_rank(self._config, spec, local_rank)
        files.prepare()
        command = rank_command(spec, bundle_dir, local_rank)
        env = rank_env(self._config, spec, local_rank, files)
        env[ENV_AGENT_SESSION] = self._session
        write_rank_control(files.control, spec, local_rank)
        handler, how = start_rank(command, env, files, local_rank, self._pool)
        self._reaper.watch(handler.proc.pid)
        rank = Rank(local_rank, global_rank(spec, local_rank), files, handler, origin_round=spec["round"])
        local.ranks.append(rank)
        self._shipper.add(
            spec["job_id"], spec["round"], rank.rank, files.telemetry, files.stdout, files.stderr
        )
        return how

    def _carry_over(self, slot: JobSlot, spec: RoundSpec) -> bool:
        """An in-place round (protocol.CarryOver): this host's ranks of the previous round keep
        running with their new ranks (their control files say so; sdk.elastic re-forms at the
        next step boundary) and only the round's other local ranks start. False when the ranks
        here cannot all carry over (the round then replaces the old one the usual way)."""
        carried = carried_ranks(spec)
        old = slot.active
        if carried is None or old is None or "ps" in spec:
            return False
        if old.number != spec["carry_over"]["from_round"] or old.state is not RoundState.RUNNING:
            return False
        if old.stop_reason or slot.pending is not None:
            return False
        first = spec["node_rank"] * spec["nproc_per_node"]
        moves = [(rank, carried.get(rank.rank, -1)) for rank in old.ranks]
        if not moves or any(
            rank.state is not RankState.RUNNING or not first <= new < first + spec["nproc_per_node"]
            for rank, new in moves
        ):
            return False
        local = LocalRound(spec=spec, state=RoundState.RUNNING)
        for rank, new in moves:
            self._shipper.carry((old.job_id, old.number, rank.rank), (local.job_id, local.number, new))
            rank.rank, rank.local_rank = new, new - first
            write_rank_control(rank.files.control, spec, rank.local_rank)
            local.ranks.append(rank)
        old.ranks = []
        old.state = RoundState.STOPPED  # the controller ended it when it made this round
        self._shipper.forget_round(old.job_id, old.number)
        slot.active = local
        kept = {rank.local_rank for rank in local.ranks}
        newcomers = [i for i in range(spec["nproc_per_node"]) if i not in kept]
        try:
            bundle_dir = fetch_bundle(self._config, spec) if newcomers else None  # cached by now
            for local_rank in newcomers:
                self._spawn_rank(local, bundle_dir, local_rank)
        except (LaunchError, OSError) as exc:
            logger.error("job %s round %s cannot start: %s", spec["job_id"], spec["round"], exc)
            self._fail_launch(local, str(exc))
        logger.info(
            "job %s round %s in place: ranks %s kept (pids %s), local ranks %s started",
            local.job_id,
            local.number,
            [r.rank for r in local.ranks if r.local_rank in kept],
            [r.pid for r in local.ranks if r.local_rank in kept],
            newcomers,
        )
        return True

    def _regroup(self, local: LocalRound, spec: RoundSpec) -> None:
        """A parameter-server round's worker role resized in place (launcher.regroup says what
        starts and stops); the other ranks run on untouched."""
        local.spec = spec
        if local.state is not RoundState.RUNNING or local.stop_reason:
            return  # not spawned yet (it will use the new spec), or on its way out
        start, stop = regroup(spec, {rank.local_rank for rank in local.ranks})
        for rank in local.ranks:
            if rank.local_rank in stop and rank.state == RankState.RUNNING:
                _killpg(rank.pid, signal.SIGTERM)
        try:
            bundle_dir = fetch_bundle(self._config, spec) if start else None  # cached by now
            for local_rank in start:
                self._spawn_rank(local, bundle_dir, local_rank)
        except (LaunchError, OSError) as exc:
            logger.error("job %s round %s: cannot start more workers: %s", local.job_id, local.number, exc)
        logger.info(
            "job %s round %s regrouped: started %s, stopping %s", local.job_id, local.number, start, stop
        )

    def _fail_launch(self, local: LocalRound, message: str) -> None:
        now = time.time()
        for rank in local.ranks:
            _killpg(rank.pid, signal.SIGKILL)
        for local_rank in range(local.spec["nproc_per_node"]):
            local.failures.append(
                RankExit(
                    local_rank=local_rank,
                    rank=global_rank(local.spec, local_rank),
                    pid=0,
                    exit_code=None,
                    signal=None,
                    error=f"launch failed: {message}",
                    at=now,
                )
            )
        local.stop_reason = "failure"
        local.state = RoundState.STARTING  # the next tick reaps any rank that did start, then ends it

    def _begin_stop(self, local: LocalRound, grace: float, reason: Literal["command", "failure"]) -> None:
        deadline = time.monotonic() + max(0.0, grace)
        if local.stop_reason:
            if reason == "command":
                local.stop_reason = "command"
            local.stop_deadline = min(local.stop_deadline, deadline)
            return
        local.stop_reason = reason
        local.stop_deadline = deadline
        if local.state in (RoundState.RUNNING, RoundState.STARTING):
            local.state = RoundState.STOPPING if local.ranks or local.preparing else local.state
        for rank in local.ranks:
            if rank.state == RankState.RUNNING:
                _killpg(rank.pid, signal.SIGTERM)

    def _supervise(self) -> None:
        now = time.monotonic()
        # Ended codes are looked for once a second: the teardown timeout is counted in seconds.
        check_teardowns = now >= self._next_teardown_check
        if check_teardowns:
            self._next_teardown_check = now + TEARDOWN_CHECK_INTERVAL_SECONDS
        for slot in self._jobs.values():
            local = slot.active
            if local is None:
                continue
            if local.preparing is not None:
                if not local.preparing.done():
                    continue
                future, local.preparing = local.preparing, None
                if local.stop_reason == "command":
                    pass
                elif future.exception() is not None:
                    self._fail_launch(local, str(future.exception()))
                else:
                    self._spawn(local, future.result())
            for rank in local.ranks:
                if rank.state == RankState.RUNNING:
                    returncode = rank.handler.proc.poll()
                    if returncode is not None:
                        self._rank_ended(local, rank, returncode)
                    elif check_teardowns and not local.stop_reason and not rank.killed_in_teardown:
                        self._check_teardown(local, rank)
            if local.stop_reason and not local.killed and now >= local.stop_deadline:
                local.killed = True
                for rank in local.ranks:
                    if rank.state == RankState.RUNNING:
                        logger.warning(
                            "job %s round %s: SIGKILL rank %s", local.job_id, local.number, rank.rank
                        )
                        _killpg(rank.pid, signal.SIGKILL)
            if all(rank.state != RankState.RUNNING for rank in local.ranks) and (
                local.state != RoundState.STARTING or local.stop_reason
            ):
                self._round_ended(slot, local)

    def _check_teardown(self, local: LocalRound, rank: Rank) -> None:
        """Kills a rank whose code ended --teardown-timeout seconds ago but whose interpreter is
        still tearing down (a gloo DDP rank can deadlock there: runner.py)."""
        since = seconds_since_code_ended(rank.files)
        if since is None or since < self._config.teardown_timeout:
            return
        logger.warning(
            "job %s round %s: rank %s ended its code %.0f s ago but its interpreter has not exited: SIGKILL",
            local.job_id,
            local.number,
            rank.rank,
            since,
        )
        rank.killed_in_teardown = True
        _killpg(rank.pid, signal.SIGKILL)

    def _rank_ended(self, local: LocalRound, rank: Rank, returncode: int) -> None:
        # Whatever the rank left behind in its group (DataLoader workers, shells) goes with it.
        _killpg(rank.pid, signal.SIGKILL)
        self._reaper.forget(rank.pid)
        rank.handler.close_files()
        self._shipper.finish(local.job_id, local.number, rank.rank)
        if local.stop_reason or removed(local.spec, rank.local_rank):
            rank.state = RankState.STOPPED
            return
        teardown = ""
        ended_with = code_ending(rank.files) if returncode < 0 else None
        if ended_with is not None:
            # The code had ended: its status is the rank's; the signal only ended the teardown.
            teardown = "hung" if rank.killed_in_teardown else (signal_name(returncode) or "")
            logger.warning(
                "job %s round %s: rank %s ended its code with status %s; its teardown: %s",
                local.job_id,
                local.number,
                rank.rank,
                ended_with,
                teardown,
            )
            returncode = ended_with
        rank.state = RankState.SUCCEEDED if returncode == 0 else RankState.FAILED
        exit_ = RankExit(
            local_rank=rank.local_rank,
            rank=rank.rank,
            pid=rank.pid,
            exit_code=returncode if returncode >= 0 else None,
            signal=signal_name(returncode),
            error=error_message(rank, returncode) if returncode != 0 else "",
            at=time.time(),
        )
        if teardown:
            exit_["teardown"] = teardown
        logger.info(
            "job %s round %s: rank %s exited (%s)",
            local.job_id,
            local.number,
            rank.rank,
            exit_["signal"] or returncode,
        )
        self._control.send(protocol.CONTROL_RANK_EXITED, job_id=local.job_id, round=local.number, exit=exit_)
        if returncode != 0 and not survivable(local.spec, rank.local_rank):
            local.failures.append(exit_)
            # Like torchrun's local agent: one failed rank fails the local worker group.
            self._begin_stop(local, self._grace(local.spec), "failure")

    def _round_ended(self, slot: JobSlot, local: LocalRound) -> None:
        if local.stop_reason == "command":
            outcome: RoundState = RoundState.STOPPED
        elif local.failures:
            outcome = RoundState.FAILED
        else:
            outcome = RoundState.SUCCEEDED
        local.state = outcome
        slot.active = None
        if slot.last_ended is not None:
            self._shipper.forget_round(slot.last_ended.job_id, slot.last_ended.number)
        slot.last_ended = local
        logger.info("job %s round %s ended: %s", local.job_id, local.number, outcome)
        self._control.send(
            protocol.CONTROL_ROUND_ENDED,
            job_id=local.job_id,
            round=local.number,
            outcome=outcome,
            failures=local.failures,
        )
        if slot.pending is not None and not self._shutting_down:
            spec, slot.pending = slot.pending, None
            self._launch(slot, spec)
        self._prune()

    def _prune(self) -> None:
        """Removes old rounds' files (retention.py) on the preparer's threads, one pass at a time:
        at the first tick, when a round ends, and at least every PRUNE_INTERVAL_SECONDS."""
        if self._config.keep_rounds_days <= 0 or (self._pruning is not None and not self._pruning.done()):
            return
        self._next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS
        held = [(job_id, number) for job_id, slot in self._jobs.items() for number in slot.held_rounds()]
        self._pruning = self._preparer.submit(
            prune_rounds, self._config.rounds_dir, self._config.keep_rounds_days, held
        )

    # --- fencing memory ----------------------------------------------------------------------
    def _load_fencing(self) -> None:
        try:
            data = json.loads(self._fencing_file.read_text())
        except (OSError, ValueError):
            return
        for job_id, (newest, fenced_upto) in data.items():
            self._jobs[int(job_id)] = JobSlot(newest=int(newest), fenced_upto=int(fenced_upto))

    def _save_fencing(self) -> None:
        data = {str(job_id): [slot.newest, slot.fenced_upto] for job_id, slot in self._jobs.items()}
        tmp = self._fencing_file.with_suffix(".tmp")
        try:
            self._fencing_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._fencing_file)
        except OSError:
            logger.exception("could not save %s", self._fencing_file)
