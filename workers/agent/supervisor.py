"""Supervision of the rank processes: one loop on one thread of the agent's main process.

Celery tasks never touch processes; they hand a command (start round, stop job, sync, shut
down) to this loop and return, so the node queue is never blocked by a grace period. Each tick
the loop takes the commands, then, for every round, monitors (monitor.py: polls every rank;
SUPERVISE_INTERVAL_SECONDS keeps an exit noticed well within a second), decides (decide.py: pure
functions from the round and the observation to actions) and acts (here: signals, launches,
messages to the controller). Each job is a `JobSlot` (lifecycle.py: `SlotState` IDLE, RUNNING,
REPLACING, CLOSING, moved by its methods), whose round's state moves only through
`LocalRound.set_state` (`LocalState`), and its ranks' through `Rank.set_state`.

Per job the host runs at most one round. A newer round first stops the running one (SIGTERM to
each rank where launcher.stop_signal_target says, the round's grace period, then SIGKILL; the
slot is REPLACING) and starts once every rank of the old one has ended; an in-place round
(RoundSpec.carry_over) instead keeps the old round's running ranks and starts only the others. Commands for a round older than
the newest seen for the job are ignored (fencing); the newest round per job is kept in
``<data-dir>/fencing.json`` so a command redelivered after an agent restart cannot bring an old
round back.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from workers.agent.actor import RoundActor
from workers.agent.config import AgentConfig
from workers.agent.control import ControlClient
from workers.agent.decide import (
    Action,
    End,
    StopReason,
    decide_stop,
    decide_tick,
)
from workers.agent.lifecycle import InplaceReport, JobSlot, LocalRound, LocalState, SlotState
from workers.agent.monitor import observe
from workers.agent.reaper import ReaperClient
from workers.agent.retention import prune_rounds
from workers.agent.shipper import TelemetryShipper
from workers.agent.warmpool import WarmPool
from workers.protocol import InplaceStatus, RankState, RankStatus, RoundSpec, RoundStatus
from workers.sdk import progress_cell

logger = logging.getLogger(__name__)

SUPERVISE_INTERVAL_SECONDS = 0.1
DEFAULT_GRACE_PERIOD_SECONDS = 30.0
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


@dataclass(frozen=True)
class WatchedRank:
    rank: int
    local_rank: int
    pid: int
    directory: Path  # its files (launcher.RankFiles)
    progress: Path  # its SDK step cell


@dataclass(frozen=True)
class WatchedRound:
    spec: RoundSpec
    ranks: tuple[WatchedRank, ...]


def grace_of(spec: RoundSpec) -> float:
    grace = spec.get("grace_period")
    return float(grace) if grace is not None and grace >= 0 else DEFAULT_GRACE_PERIOD_SECONDS


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
        self._config = config
        self._shipper = shipper
        self._commands: queue.Queue[Command] = queue.Queue()
        self._lock = threading.Lock()
        self._jobs: dict[int, JobSlot] = {}
        self._preparer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        self._actor = RoundActor(config, session, control, shipper, reaper, pool, self._preparer)
        self._shutting_down = False
        self._fencing_file = config.data_dir / "fencing.json"
        self._load_fencing()
        self._pruning: Future[list[Path]] | None = None
        self._next_prune = 0.0  # monotonic
        self._next_teardown_check = 0.0  # monotonic

    @property
    def on_news(self) -> Callable[[], None] | None:
        """Called when the controller should hear before the next heartbeat (the agent's
        Heartbeat.poke): a rank of a round recovered in place waits for the next round."""
        return self._actor.on_news

    @on_news.setter
    def on_news(self, callback: Callable[[], None] | None) -> None:
        self._actor.on_news = callback

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
                    state=local.state.reported,
                    ranks=[
                        RankStatus(local_rank=r.local_rank, rank=r.rank, pid=r.pid, state=r.state)
                        for r in local.ranks
                    ],
                    last_step=progress.last_step,
                    first_step_at=progress.first_step_at,
                )
                if progress.total_steps is not None:
                    status["total_steps"] = progress.total_steps
                steps = {
                    str(r.rank): step
                    for r in local.ranks
                    if r.state is RankState.RUNNING
                    and (step := self.rank_step(local.job_id, local.number, r.rank, r.files.progress))
                    is not None
                }
                if steps:
                    status["rank_steps"] = steps
                if local.reports_inplace:
                    said = local.inplace or InplaceReport(InplaceStatus.FORMING)
                    status["inplace"], status["inplace_reason"] = said.status, said.reason
                    if said.formed_at:
                        status["inplace_formed_at"] = said.formed_at
                statuses.append(status)
            return statuses

    def watched(self) -> list[WatchedRound]:
        """The rounds whose ranks run here now, for the hang watcher (hangwatch.py)."""
        with self._lock:
            return [
                WatchedRound(
                    slot.active.spec,
                    tuple(
                        WatchedRank(r.rank, r.local_rank, r.pid, r.files.directory, r.files.progress)
                        for r in slot.active.ranks
                        if r.state is RankState.RUNNING
                    ),
                )
                for slot in self._jobs.values()
                if slot.state is SlotState.RUNNING
                and slot.active is not None
                and slot.active.state is LocalState.RUNNING
            ]

    def rank_step(self, job_id: int, number: int, rank: int, cell: Path) -> int | None:
        """A rank's newest step: its SDK step cell, else the newest step its telemetry logged."""
        steps = [
            step
            for step in (progress_cell.read(cell), self._shipper.rank_step(job_id, number, rank))
            if step is not None
        ]
        return max(steps, default=None)

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
                if self._shutting_down and all(slot.state is SlotState.IDLE for slot in self._jobs.values()):
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
            self._shutting_down = True  # the agent's own life: no job's round starts again
            for slot in self._jobs.values():
                slot.close()
                if slot.active is not None:
                    self._stop_round(slot.active, grace_of(slot.active.spec))

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
                self._actor.regroup(slot.active, spec)  # a parameter-server round's workers resized
            return  # a repeated command (redelivery, sync) for the round already here
        slot.newest = number
        self._save_fencing()
        if slot.state is SlotState.RUNNING and slot.active is not None and "carry_over" in spec:
            carried = self._actor.carry_over(slot.active, spec)  # in place: survivors keep running
            if carried is not None:
                slot.run(carried)
                return
        if slot.active is not None:
            logger.info(
                "job %s: stopping round %s before round %s", spec["job_id"], slot.active.number, number
            )
            self._stop_round(slot.active, grace_of(slot.active.spec))
            slot.replace(spec)
            return
        slot.run(self._actor.launch(spec))

    def _stop_job(self, job_id: int, number: int, grace: float) -> None:
        slot = self._slot(job_id)
        slot.newest = max(slot.newest, number)
        slot.fenced_upto = max(slot.fenced_upto, number)
        self._save_fencing()
        slot.cancel(number)
        if slot.active is not None and slot.active.number <= number:
            self._stop_round(slot.active, grace)

    def _sync(self, rounds: list[RoundSpec]) -> None:
        wanted = {(spec["job_id"], spec["round"]) for spec in rounds}
        for job_id, slot in self._jobs.items():
            if slot.pending is not None and (job_id, slot.pending["round"]) not in wanted:
                slot.cancel(slot.pending["round"])
            if slot.active is not None and (job_id, slot.active.number) not in wanted:
                slot.fenced_upto = max(slot.fenced_upto, slot.active.number)
                self._stop_round(slot.active, grace_of(slot.active.spec))
        self._save_fencing()
        for spec in rounds:
            self._start(spec)

    # --- monitor, decide, act ----------------------------------------------------------------
    def _supervise(self) -> None:
        now = time.monotonic()
        # Ended codes are looked for once a second: the teardown timeout is counted in seconds.
        look_at_teardowns = now >= self._next_teardown_check
        if look_at_teardowns:
            self._next_teardown_check = now + TEARDOWN_CHECK_INTERVAL_SECONDS
        for slot in self._jobs.values():
            local = slot.active
            if local is None:
                continue
            seen = observe(local, look_at_teardowns)
            if seen.fetched is not None:
                local.fetch = None  # taken: decided on now, spawned or dropped
            actions = decide_tick(local, seen, now, grace_of(local.spec), self._config.teardown_timeout)
            self._act(slot, local, actions)

    def _stop_round(self, local: LocalRound, grace: float) -> None:  # (threading.Thread has a _stop)
        self._act(None, local, decide_stop(local, StopReason.COMMAND, grace, time.monotonic()))

    def _act(self, slot: JobSlot | None, local: LocalRound, actions: list[Action]) -> None:
        end = self._actor.act(local, actions)
        if end is not None:
            assert slot is not None, "a round ends only in a tick"
            self._round_ended(slot, local, end)

    def _round_ended(self, slot: JobSlot, local: LocalRound, end: End) -> None:
        if not self._actor.end(local, end):
            return
        if slot.last_ended is not None:
            self._shipper.forget_round(slot.last_ended.job_id, slot.last_ended.number)
        pending = slot.ended(local)
        if pending is not None:
            slot.run(self._actor.launch(pending))
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
