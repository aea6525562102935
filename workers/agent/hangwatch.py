"""The agent's hang watcher: one thread that samples every running rank twice a second.

Each sample reads the rank's process (psutil: CPU time, memory, state; NVML where the host has
GPUs: the process's GPU memory and its GPUs' utilisation), ships it as the rank's resource metrics
(``res_cpu_percent``, ``res_memory_bytes``, ``res_gpu_util_percent``, ``res_gpu_memory_bytes``,
through the telemetry shipper like the rank's own), and feeds hang.py's watches with the rank's
newest step (the shipper saw it) or, for a rank that reports no steps, its CPU and, while it is
busy, its stack. When ``hang.judge`` finds ranks stalled, or the controller asks
(AGENT_COLLECT_STACKS), it reads every local rank's stacks (stacks.py) and sends
CONTROL_HANG_REPORTED. It only reads processes: it never signals one; the controller decides what
a hang costs (console/jobs/hangs.py).

Its cost is the agent's, not the ranks': a few /proc reads per rank per sample; py-spy suspends a
rank only for a stack sample of a busy rank without step reports (a few times per threshold) and
for a hang report.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from workers.agent import stacks
from workers.agent.hang import Policy, RankWatch, judge, mark_reported, wants_stack_sample
from workers.protocol import CONTROL_HANG_REPORTED, HangReport, RankStack, RoundSpec
from workers.sdk import progress_cell

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_SECONDS = 0.5
STOPPED_STATES = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class Watched(Protocol):
    """What the supervisor says about a round (supervisor.WatchedRound)."""

    @property
    def spec(self) -> RoundSpec: ...

    @property
    def ranks(self) -> tuple[Any, ...]: ...


class Steps(Protocol):
    """What the shipper tells and takes (shipper.TelemetryShipper)."""

    def rank_step(self, job_id: int, round_: int, rank: int) -> int | None: ...

    def push(self, key: tuple[int, int, int], records: list[dict[str, Any]]) -> None: ...


@dataclass
class Sample:
    cpu_s: float
    memory_bytes: int
    state: str
    gpu_memory_bytes: int | None = None
    gpu_util_percent: float | None = None


@dataclass
class _RoundWatch:
    policy: Policy
    watches: dict[int, RankWatch] = field(default_factory=dict)
    processes: dict[int, psutil.Process] = field(default_factory=dict)
    directories: dict[int, Path] = field(default_factory=dict)
    seq: int = 0


class Gpus:
    """NVML through nvidia-ml-py, when the host has it (unverified here: no GPU)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:
            self._nvml = None

    def of(self, pid: int) -> tuple[int | None, float | None]:
        """(GPU memory the process holds, mean utilisation of the GPUs it uses)."""
        if self._nvml is None:
            return None, None
        memory, utils = 0, []
        try:
            for handle in self._handles:
                held = [p for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid]
                if held:
                    memory += sum(int(p.usedGpuMemory or 0) for p in held)
                    utils.append(float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        except Exception:
            return None, None
        return memory, (sum(utils) / len(utils) if utils else 0.0)


def sample(process: psutil.Process, gpus: Gpus) -> Sample | None:
    """The process and its children (DataLoader workers) together; None once it is gone."""
    try:
        with process.oneshot():
            times = process.cpu_times()
            cpu = times.user + times.system
            memory = process.memory_info().rss
            state = process.status()
        for child in process.children(recursive=True):
            try:
                child_times = child.cpu_times()
                cpu += child_times.user + child_times.system
                memory += child.memory_info().rss
            except psutil.Error:
                continue
    except psutil.Error:
        return None
    gpu_memory, gpu_util = gpus.of(process.pid)
    return Sample(cpu, memory, state, gpu_memory, gpu_util)


class HangWatcher(threading.Thread):
    def __init__(
        self,
        rounds: Callable[[], list[Any]],
        shipper: Steps,
        send: Callable[..., None],
        interval: float = SAMPLE_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="hang-watcher", daemon=True)
        self._rounds = rounds
        self._shipper = shipper
        self._send = send
        self._interval = interval
        self._clock = clock
        self._watched: dict[tuple[int, int], _RoundWatch] = {}
        self._asked: queue.Queue[tuple[int, int, str]] = queue.Queue()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._gpus: Gpus | None = None

    def collect(self, job_id: int, round_: int, reason: str) -> None:
        """The controller asks for the round's stacks (AGENT_COLLECT_STACKS)."""
        self._asked.put((int(job_id), int(round_), reason))
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.join(timeout=5)

    def run(self) -> None:
        self._gpus = Gpus()
        while not self._stopping.is_set():
            started = self._clock()
            try:
                self.tick()
            except Exception:
                logger.exception("hang watcher tick failed")
            self._wake.wait(max(0.0, self._interval - (self._clock() - started)))
            self._wake.clear()

    def tick(self) -> None:
        now = self._clock()
        asked: dict[tuple[int, int], str] = {}
        while True:
            try:
                job_id, round_, reason = self._asked.get_nowait()
            except queue.Empty:
                break
            asked[(job_id, round_)] = reason
        seen = set()
        for watched in self._rounds():
            key = (watched.spec["job_id"], watched.spec["round"])
            seen.add(key)
            state = self._watched.get(key)
            if state is None:
                state = self._watched[key] = _RoundWatch(Policy.of(watched.spec.get("hang")))
            self._sample(key, watched, state, now)
            verdict = judge(list(state.watches.values()), state.policy, now)
            if verdict is not None:
                mark_reported(state.watches.values(), verdict.stalled)
                self._report(key, state, "stall", list(verdict.stalled), verdict.threshold_s, now)
            elif key in asked:
                self._report(key, state, "asked", [], 0.0, now)
        for key in set(self._watched) - seen:
            del self._watched[key]

    def _sample(self, key: tuple[int, int], watched: Any, state: _RoundWatch, now: float) -> None:
        job_id, round_ = key
        gpus = self._gpus or Gpus()
        for rank in watched.ranks:
            watch = state.watches.get(rank.rank)
            if watch is None or watch.pid != rank.pid:
                watch = state.watches[rank.rank] = RankWatch(rank.rank, rank.local_rank, rank.pid, now)
                state.directories[rank.rank] = rank.directory
                try:
                    state.processes[rank.rank] = psutil.Process(rank.pid)
                except psutil.Error:
                    continue
            process = state.processes.get(rank.rank)
            if process is None:
                continue
            seen = sample(process, gpus)
            if seen is None:
                continue
            watch.note_step(self._step(job_id, round_, rank), now)
            busy = watch.note_cpu(seen.cpu_s, now)
            if wants_stack_sample(watch, state.policy, busy, now):
                threads, _, _ = stacks.dump(rank.pid, native=False, stopped=seen.state in STOPPED_STATES)
                watch.note_stack(stacks.signature(threads), now)
            state.seq += 1
            values: dict[str, float | int] = {
                "res_cpu_percent": round(watch.cpu_percent, 2),
                "res_memory_bytes": seen.memory_bytes,
            }
            if seen.gpu_memory_bytes is not None:
                values["res_gpu_memory_bytes"] = seen.gpu_memory_bytes
            if seen.gpu_util_percent is not None:
                values["res_gpu_util_percent"] = seen.gpu_util_percent
            # On the step axis with the rank's own points; a rank without steps: seconds since start.
            step = watch.step if watch.step is not None else int(now - watch.started_at)
            record = {"kind": "metric", "seq": state.seq, "t": time.time(), "step": step, "values": values}
            self._shipper.push((job_id, round_, rank.rank), [record])

    def _step(self, job_id: int, round_: int, rank: Any) -> int | None:
        steps = [
            step
            for step in (
                progress_cell.read(rank.progress),
                self._shipper.rank_step(job_id, round_, rank.rank),
            )
            if step is not None
        ]
        return max(steps, default=None)

    def _report(
        self,
        key: tuple[int, int],
        state: _RoundWatch,
        reason: str,
        stalled: list[int],
        threshold: float,
        now: float,
    ) -> None:
        """Python stacks first, read from every rank at once (py-spy --nonblocking: a fraction of a
        second), sent at once; then native frames (py-spy --native suspends the rank and unwinds
        torch's libraries: seconds), sent as a second report ("native") that adds them."""
        job_id, round_ = key
        watches = sorted(state.watches.values(), key=lambda w: w.rank)
        states = {w.rank: self._process_state(state, w.rank) for w in watches}
        with ThreadPoolExecutor(max_workers=max(1, len(watches))) as pool:
            dumps = list(pool.map(lambda w: stacks.dump(w.pid, native=False), watches))
        ranks = [
            self._rank_stack(state, w, states[w.rank], dumped, now)
            for w, dumped in zip(watches, dumps, strict=True)
        ]
        report: HangReport = {
            "reason": reason,
            "detected_at": time.time(),
            "threshold_s": threshold,
            "stalled": stalled,
            "ranks": ranks,
        }
        logger.warning("job %s round %s: %s, ranks %s; stacks sent", job_id, round_, reason, stalled or "all")
        self._send(CONTROL_HANG_REPORTED, job_id=job_id, round=round_, report=report)
        running = [w for w in watches if states[w.rank] not in STOPPED_STATES and states[w.rank] != "gone"]
        if not running:
            return
        with ThreadPoolExecutor(max_workers=len(running)) as pool:
            natives = list(pool.map(lambda w: stacks.dump(w.pid, native=True), running))
        native = [
            self._rank_stack(state, w, states[w.rank], dumped, now)
            for w, dumped in zip(running, natives, strict=True)
            if dumped[1]
        ]
        if native:
            report = {**report, "reason": "native", "detected_at": time.time(), "ranks": native}
            self._send(CONTROL_HANG_REPORTED, job_id=job_id, round=round_, report=report)

    @staticmethod
    def _process_state(state: _RoundWatch, rank: int) -> str:
        process = state.processes.get(rank)
        try:
            return str(process.status()) if process is not None else "gone"
        except psutil.Error:
            return "gone"

    @staticmethod
    def _rank_stack(
        state: _RoundWatch, watch: RankWatch, process_state: str, dumped: tuple[Any, bool, str], now: float
    ) -> RankStack:
        threads, native, error = dumped
        stack: RankStack = {
            "rank": watch.rank,
            "local_rank": watch.local_rank,
            "pid": watch.pid,
            "process_state": process_state,
            "step": watch.step,
            "stalled_s": round(now - watch.last_progress, 3),
            "cpu_percent": round(watch.cpu_percent, 2),
            "threads": threads,
            "native": native,
            "error": error,
        }
        directory = state.directories.get(watch.rank)
        dumped_trace = stacks.flight_recorder_dump(directory, watch.rank) if directory else ""
        if dumped_trace:
            stack["flight_recorder"] = dumped_trace
        return stack
