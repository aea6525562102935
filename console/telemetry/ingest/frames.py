"""Live frames: what viewers of a job get while it runs, and how often.

Rank 0's new points and every new log line are gathered per job. A job with something new gets
a frame at once if its last one is FRAME_INTERVAL old, else as soon as it is: its series thinned
with ``downsample.thin_points`` to a budget of FRAME_BUDGET points over all series, serialised
once (the client JSON) and numbered per job.
A job that some web process reports busy (fanout.BUSY_VIEWERS viewers or more) gets a frame every
BUSY_FRAME_INTERVAL instead: each frame costs that process one send per viewer. Nothing here
does I/O; the sink given to ``flush`` delivers (console.telemetry.ingest.broadcast).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from console.telemetry.downsample import finite_or_none, thin_points
from console.telemetry.ingest.decoding import MetricRow
from console.telemetry.ingest.storage import StoredLog

FRAME_INTERVAL = 0.1
# 200 viewers at 10 frames/s cost Daphne about 15 % of a core here, with the frame reaching them
# 41 ms (p95) after it was published (bench/telemetry, fan-out phase), so the valve that slows a
# busy job to 4 frames/s is set well above that (fanout.BUSY_VIEWERS).
BUSY_FRAME_INTERVAL = 0.25
BUSY_CHECK_EVERY = 1.0
FRAME_POINTS = 100
# Points per frame over all series. 200 viewers of 1,000-point frames fell seconds behind here;
# many series share this budget, each keeping at least FRAME_MIN_POINTS.
FRAME_BUDGET = 100
FRAME_MIN_POINTS = 10
FRAME_LOG_LINES = 200
# Every rank of a DDP job logs the same loss; viewers get rank 0's series.
FRAME_RANK = 0


@dataclass(frozen=True)
class Frame:
    """One job's frame as it goes out: client JSON for the metrics and for the log tail."""

    job_id: int
    number: int
    metrics: str | None
    log: str | None


class FrameSink(Protocol):
    def deliver(self, frame: Frame) -> None: ...


@dataclass
class JobFrame:
    """What a job's next frame will carry."""

    round_number: int = 0
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    logs_skipped: int = 0


class BusyJobs:
    """Whether a job is busy, asked of ``probe`` (Redis: fanout.busy_key) at most once per
    BUSY_CHECK_EVERY per job; a failed probe counts as not busy."""

    def __init__(self, probe: Callable[[int], bool]) -> None:
        self.probe = probe
        self.checked: dict[int, tuple[float, bool]] = {}

    def __call__(self, job_id: int, now: float) -> bool:
        checked = self.checked.get(job_id)
        if checked is not None and now - checked[0] < BUSY_CHECK_EVERY:
            return checked[1]
        try:
            busy = self.probe(job_id)
        except Exception:
            busy = False
        self.checked[job_id] = (now, busy)
        return busy

    def forget(self, job_id: int) -> None:
        self.checked.pop(job_id, None)


def never_busy(job_id: int) -> bool:
    return False


class Frames:
    """Pending frames of every job. Thread-safe: ingest's reader adds first deliveries' points
    and its writer adds replays' points and log lines, and both flush."""

    def __init__(self, interval: float = FRAME_INTERVAL, busy: Callable[[int], bool] = never_busy) -> None:
        self.interval = interval
        self.busy = BusyJobs(busy)
        self.lock = threading.Lock()
        self.pending: dict[int, JobFrame] = {}
        self.numbers: dict[int, int] = {}
        self.sent_at: dict[int, float] = {}

    def add_points(self, rows: Iterable[MetricRow]) -> None:
        with self.lock:
            last: tuple[int, int] | None = None
            series: dict[str, list[tuple[int, float]]] = {}
            for job_id, round_number, rank, _seq, step, name, value, _t in rows:
                if rank != FRAME_RANK:
                    continue
                if (job_id, round_number) != last:  # rows come in runs of one job and round
                    last = (job_id, round_number)
                    series = self._frame(job_id, round_number).series
                points = series.get(name)
                if points is None:
                    points = series[name] = []
                points.append((step, value))

    def add_logs(self, logs: Iterable[StoredLog]) -> None:
        with self.lock:
            for row_id, job_id, round_number, rank, stream, seq, text in logs:
                frame = self._frame(job_id, round_number)
                if len(frame.logs) >= FRAME_LOG_LINES:
                    # The live tail keeps the newest lines; viewers that want every line page
                    # through the logs API.
                    frame.logs.pop(0)
                    frame.logs_skipped += 1
                frame.logs.append({"id": row_id, "rank": rank, "stream": stream, "text": text, "seq": seq})

    def _frame(self, job_id: int, round_number: int) -> JobFrame:
        frame = self.pending.get(job_id)
        if frame is None:
            frame = self.pending[job_id] = JobFrame()
        frame.round_number = max(frame.round_number, round_number)
        return frame

    def flush(self, sink: FrameSink, force: bool = False) -> None:
        """Deliver the frames that are due (all of them with ``force``). Under the lock, so that
        frames reach the sink in the order of their numbers."""
        with self.lock:
            now = time.monotonic()
            # A job whose last frame is older than its interval gets one at once (points that
            # arrive after a quiet spell wait for nothing); otherwise its points gather, and the
            # next frame carries them too, thinned as usual.
            due = [job_id for job_id in self.pending if force or not self._held_back(job_id, now)]
            for job_id in due:
                frame = self.pending.pop(job_id)
                self.sent_at[job_id] = now
                number = self.numbers[job_id] = self.numbers.get(job_id, 0) + 1
                sink.deliver(render(job_id, number, frame))

    def _held_back(self, job_id: int, now: float) -> bool:
        since = now - self.sent_at.get(job_id, -math.inf)
        if since < self.interval:
            return True
        return since < BUSY_FRAME_INTERVAL and self.busy(job_id, now)

    def jobs(self) -> set[int]:
        with self.lock:
            return set(self.pending) | set(self.numbers)

    def forget(self, job_id: int) -> None:
        """Drop a job's state (its job has ended). Points still pending go: a job that ended
        has no more live viewers to draw them, and the database has them."""
        with self.lock:
            self.pending.pop(job_id, None)
            self.numbers.pop(job_id, None)
            self.sent_at.pop(job_id, None)
            self.busy.forget(job_id)


def render(job_id: int, number: int, frame: JobFrame) -> Frame:
    """The client JSON of a frame, built once for all of the job's viewers."""
    metrics = log = None
    if frame.series:
        limit = max(FRAME_MIN_POINTS, min(FRAME_POINTS, FRAME_BUDGET // len(frame.series)))
        series = {
            name: [[step, finite_or_none(value)] for step, value in thin_points(points, limit)]
            for name, points in frame.series.items()
        }
        metrics = json.dumps(
            {"type": "metrics", "series": series, "round": frame.round_number, "frame": number},
            separators=(",", ":"),
            allow_nan=False,
        )
    if frame.logs:
        log = json.dumps(
            {"type": "log", "lines": frame.logs, "skipped": frame.logs_skipped, "frame": number},
            separators=(",", ":"),
        )
    return Frame(job_id, number, metrics, log)
