"""Statistics of PS processes, workers and the shard queue, and their telemetry.

Each process reports through the SDK's telemetry (JSON lines the agent ships), as metrics whose
step is the process's own counter (a PS's version, a worker's pushes, the queue's completed
shards), so the console stores them with the ingest it has. Names are prefixed by role:
``ps_*`` (rows held, memory, pull/push rate and latency), ``worker_*`` (throughput, staleness),
``queue_*`` (shards done / in progress / to do, epoch).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

import psutil

# Latencies kept per operation for percentiles: the last few seconds of a busy PS.
WINDOW = 4096


class Latencies:
    """Durations of recent calls and a count of all of them; thread-safe enough (deque appends
    are atomic) for gRPC handler threads."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.count = 0

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.count += 1

    def percentile_ms(self, fraction: float) -> float:
        values = sorted(self.recent)
        if not values:
            return 0.0
        return values[min(len(values) - 1, int(fraction * len(values)))] * 1000.0


@dataclass
class PsStats:
    index: int
    count: int
    mode: str
    version: int
    rows: int
    row_budget: int | None
    bytes_held: int
    rss_bytes: int
    pulls: int
    pushes: int
    pull_p50_ms: float
    pull_p99_ms: float
    push_p50_ms: float
    push_p99_ms: float
    duplicates: int
    stale: int
    late: int
    applied_batches: int
    restored_from: str
    checkpoint_version: int

    def metrics(self, since: PsStats | None, elapsed: float) -> dict[str, float]:
        rate = 1.0 / elapsed if since is not None and elapsed > 0 else 0.0
        return {
            "ps_rows": self.rows,
            "ps_bytes_held": self.bytes_held,
            "ps_memory_bytes": self.rss_bytes,
            "ps_pulls_per_s": (self.pulls - since.pulls) * rate if since else 0.0,
            "ps_pushes_per_s": (self.pushes - since.pushes) * rate if since else 0.0,
            "ps_pull_p50_ms": self.pull_p50_ms,
            "ps_pull_p99_ms": self.pull_p99_ms,
            "ps_push_p50_ms": self.push_p50_ms,
            "ps_push_p99_ms": self.push_p99_ms,
            "ps_duplicates": self.duplicates,
            "ps_stale": self.stale,
            "ps_applied_batches": self.applied_batches,
        }


@dataclass
class QueueStats:
    epoch: int
    epochs: int
    shards_per_epoch: int
    done: int
    in_progress: int
    todo: int
    examples_done: int
    examples_per_epoch: int
    workers: int
    requeued: int
    rejected_completions: int
    finished: bool
    # (epoch, shard) -> times completed; the exactly-once check reads it (all ones).
    completions: dict[str, int]

    def metrics(self) -> dict[str, float]:
        return {
            "queue_epoch": self.epoch,
            "queue_epochs": self.epochs,
            "queue_shards_per_epoch": self.shards_per_epoch,
            "queue_done": self.done,
            "queue_in_progress": self.in_progress,
            "queue_todo": self.todo,
            "queue_examples_done": self.examples_done,
            "queue_examples_per_epoch": self.examples_per_epoch,
            "queue_workers": self.workers,
            "queue_requeued": self.requeued,
        }

    def summary(self) -> dict[str, object]:
        return {key: value for key, value in asdict(self).items() if key != "completions"}


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


class Reporter:
    """Calls ``report()`` every ``interval`` seconds in a daemon thread until stopped."""

    def __init__(self, interval: float, report: object) -> None:
        self.interval = interval
        self.report = report
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainyard-ps-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            self.report()  # type: ignore[operator]

    def stop(self) -> None:
        self._stopped.set()


def now() -> float:
    return time.perf_counter()
