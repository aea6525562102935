"""Acting on a host's rounds: the supervisor's hands. `RoundActor` launches a round (fetches its
bundle, spawns its ranks through launcher.py, or records the launch as failed), and carries out
the actions decide.py returns: it signals process groups, reaps ended ranks, sends rank exits and
round ends to the controller, and moves the round's state. It decides little itself, but not
nothing: `carry_over` decides whether a round can be carried over in place (else the caller starts
it afresh) and which local ranks are newcomers, `regroup` (through launcher.regroup) which ranks
of a resized parameter-server round start and stop, and a rank's SIGTERM goes to its interpreter
or its group (launcher.stop_signal_target).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workers import protocol
from workers.agent.config import AgentConfig
from workers.agent.control import ControlClient
from workers.agent.decide import (
    Action,
    End,
    FailLaunch,
    Kill,
    KillInTeardown,
    Move,
    NoteInplace,
    Poke,
    Reap,
    ReportExit,
    SetDeadline,
    Spawn,
)
from workers.agent.launcher import (
    LaunchError,
    RankFiles,
    carried_ranks,
    fetch_bundle,
    global_rank,
    rank_command,
    rank_env,
    regroup,
    removed,
    start_rank,
    stop_signal_target,
    write_rank_control,
)
from workers.agent.lifecycle import LocalRound, LocalState, Rank
from workers.agent.reaper import ENV_AGENT_SESSION, ReaperClient
from workers.agent.shipper import TelemetryShipper
from workers.agent.tensorboard import scalar_files
from workers.agent.warmpool import WarmPool
from workers.protocol import RankExit, RankState, RoundSpec

logger = logging.getLogger(__name__)


def killpg(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def signal_rank(rank: Rank, signum: signal.Signals) -> None:
    """``signum`` to the rank's process or its process group (launcher.stop_signal_target)."""
    if stop_signal_target(rank.handler, signum) == "process":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(rank.pid, signum)
    else:
        killpg(rank.pid, signum)


class RoundActor:
    def __init__(
        self,
        config: AgentConfig,
        session: str,
        control: ControlClient,
        shipper: TelemetryShipper,
        reaper: ReaperClient,
        pool: WarmPool | None,
        preparer: ThreadPoolExecutor,
    ) -> None:
        self._config = config
        self._session = session
        self._control = control
        self._shipper = shipper
        self._reaper = reaper
        self._pool = pool
        self._preparer = preparer
        # Called when the controller should hear before the next heartbeat (the agent's
        # Heartbeat.poke), for a Poke.
        self.on_news: Callable[[], None] | None = None

    def launch(self, spec: RoundSpec) -> LocalRound:
        """A new round: its bundle fetched on the preparer's threads (the supervisor's ticks
        spawn it once fetched), or its ranks spawned now."""
        local = LocalRound(spec=spec)
        if spec["bundle"]:
            local.fetch = self._preparer.submit(fetch_bundle, self._config, spec)
        else:
            self._spawn(local, None)
        return local

    def act(self, local: LocalRound, actions: list[Action]) -> End | None:
        """Carries out ``actions`` in order; returns the End among them, which the supervisor
        completes (``end``, then its own bookkeeping)."""
        for action in actions:
            if isinstance(action, Move):
                local.set_state(action.state)
            elif isinstance(action, SetDeadline):
                local.stop_deadline = action.at
            elif isinstance(action, Kill):
                if action.signum == signal.SIGKILL:
                    logger.warning(
                        "job %s round %s: SIGKILL rank %s", local.job_id, local.number, action.rank.rank
                    )
                signal_rank(action.rank, action.signum)
            elif isinstance(action, KillInTeardown):
                self._kill_in_teardown(local, action)
            elif isinstance(action, Reap):
                self._reap(local, action)
            elif isinstance(action, ReportExit):
                self._report_exit(local, action)
            elif isinstance(action, Spawn):
                self._spawn(local, action.bundle_dir)
            elif isinstance(action, FailLaunch):
                self._fail_launch(local, action.message)
            elif isinstance(action, NoteInplace):
                local.inplace = action.report
            elif isinstance(action, Poke):
                if self.on_news is not None:
                    self.on_news()
            elif isinstance(action, End):
                return action
        return None

    def end(self, local: LocalRound, end: End) -> bool:
        """The round's final state, and CONTROL_ROUND_ENDED. False (nothing done) when its
        transition table refuses the move."""
        if not local.set_state(end.outcome):
            return False
        outcome = end.outcome.reported
        logger.info("job %s round %s ended: %s", local.job_id, local.number, outcome)
        self._control.send(
            protocol.CONTROL_ROUND_ENDED,
            job_id=local.job_id,
            round=local.number,
            outcome=outcome,
            failures=local.failures,
        )
        return True

    def _spawn(self, local: LocalRound, bundle_dir: Path | None) -> None:
        spec = local.spec
        try:
            self._config.checkpoint_dir(spec["run_id"]).mkdir(parents=True, exist_ok=True)
            if self._pool is not None:
                self._pool.hold(spec["nproc_per_node"])
            starts = [
                self._spawn_rank(local, bundle_dir, local_rank)
                for local_rank in range(spec["nproc_per_node"])
                if not removed(spec, local_rank)  # a resized round sent again (sync, agent restart)
            ]
        except (LaunchError, OSError) as exc:
            logger.error("job %s round %s cannot start: %s", spec["job_id"], spec["round"], exc)
            self._fail_launch(local, str(exc))
            return
        local.set_state(LocalState.RUNNING)
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
            spec["job_id"],
            spec["round"],
            rank.rank,
            files.telemetry,
            files.stdout,
            files.stderr,
            scalars=scalar_files(spec, env, command.cwd, handler.proc.pid),
        )
        return how

    def carry_over(self, old: LocalRound, spec: RoundSpec) -> LocalRound | None:
        """An in-place round (protocol.CarryOver): this host's ranks of ``old`` keep running with
        their new ranks (their control files say so; sdk.elastic re-forms at a step boundary) and
        only the round's other local ranks start. None when the ranks here cannot all carry over
        (the round then replaces the old one the usual way)."""
        carried = carried_ranks(spec)
        if carried is None or "ps" in spec or old.state is not LocalState.RUNNING:
            return None
        if old.number != spec["carry_over"]["from_round"]:
            return None
        first = spec["node_rank"] * spec["nproc_per_node"]
        # A rank that ended here (a failure recovered in place) is replaced, not carried.
        ended = [rank for rank in old.ranks if rank.state is not RankState.RUNNING]
        if any(rank.rank in carried for rank in ended):
            return None
        moves = [(rank, carried.get(rank.rank, -1)) for rank in old.ranks if rank.state is RankState.RUNNING]
        if not moves or any(not first <= new < first + spec["nproc_per_node"] for _, new in moves):
            return None
        local = LocalRound(spec=spec, state=LocalState.RUNNING)
        for rank, new in moves:
            self._shipper.carry((old.job_id, old.number, rank.rank), (local.job_id, local.number, new))
            rank.rank, rank.local_rank = new, new - first
            write_rank_control(rank.files.control, spec, rank.local_rank)
            local.ranks.append(rank)
        old.ranks = []  # the controller ended the old round when it made this one
        self._shipper.forget_round(old.job_id, old.number)
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
        return local

    def regroup(self, local: LocalRound, spec: RoundSpec) -> None:
        """A parameter-server round's worker role resized in place (launcher.regroup says what
        starts and stops); the other ranks run on untouched."""
        local.spec = spec
        if local.state is not LocalState.RUNNING:
            return  # not spawned yet (it will use the new spec), or on its way out
        start, stop = regroup(spec, {rank.local_rank for rank in local.ranks})
        for rank in local.ranks:
            if rank.local_rank in stop and rank.state == RankState.RUNNING:
                signal_rank(rank, signal.SIGTERM)
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
        """The ranks that did start are SIGKILLed; the next ticks reap them, then end the round."""
        now = time.time()
        for rank in local.ranks:
            killpg(rank.pid, signal.SIGKILL)
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
                    launch=True,
                )
            )
        local.set_state(LocalState.LAUNCH_FAILED)

    def _kill_in_teardown(self, local: LocalRound, action: KillInTeardown) -> None:
        """A rank whose code ended --teardown-timeout seconds ago but whose interpreter is still
        tearing down (a gloo DDP rank can deadlock there: runner.py)."""
        logger.warning(
            "job %s round %s: rank %s ended its code %.0f s ago but its interpreter has not exited: SIGKILL",
            local.job_id,
            local.number,
            action.rank.rank,
            action.since,
        )
        action.rank.killed_in_teardown = True
        killpg(action.rank.pid, signal.SIGKILL)

    def _reap(self, local: LocalRound, action: Reap) -> None:
        rank = action.rank
        # Whatever the rank left behind in its group (DataLoader workers, shells) goes with it.
        killpg(rank.pid, signal.SIGKILL)
        self._reaper.forget(rank.pid)
        rank.handler.close_files()
        self._shipper.finish(local.job_id, local.number, rank.rank)
        rank.set_state(action.state)

    def _report_exit(self, local: LocalRound, action: ReportExit) -> None:
        exit_ = action.exit
        if "teardown" in exit_:
            logger.warning(
                "job %s round %s: rank %s ended its code with status %s; its teardown: %s",
                local.job_id,
                local.number,
                exit_["rank"],
                exit_["exit_code"],
                exit_["teardown"],
            )
        logger.info(
            "job %s round %s: rank %s exited (%s)",
            local.job_id,
            local.number,
            exit_["rank"],
            exit_["signal"] or exit_["exit_code"],
        )
        self._control.send(protocol.CONTROL_RANK_EXITED, job_id=local.job_id, round=local.number, exit=exit_)
        if action.failed:
            local.failures.append(exit_)
