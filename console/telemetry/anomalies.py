"""Anomaly detection on the metric stream, run by ingest on every newly stored point.

Detectors keep a little state per (job, round) in memory and report an ``Anomaly`` once per
episode. Ranks ship independently, so points of one step arrive out of order across ranks;
episodes are therefore delimited by *steps*, not by arrival: an episode ends only once a normal
value is seen at a step after the last bad one, and a bad value at or before the newest normal
step belongs to the episode already reported.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

LOSS_NAME = "loss"
GRAD_NORM_NAME = "grad_norm"
# The SDK's step monitor logs "step_time_s" and "samples_per_s"; scripts that log their own
# timing tend to say "step_time" and "throughput".
STEP_TIME_NAMES = ("step_time", "step_time_s")
THROUGHPUT_NAMES = ("throughput", "samples_per_s")
WATCHED_NAMES = (LOSS_NAME, GRAD_NORM_NAME, *STEP_TIME_NAMES, *THROUGHPUT_NAMES)
_WATCHED = frozenset(WATCHED_NAMES)

# A gradient norm above this multiple of the rolling median is a spike.
GRAD_SPIKE_FACTOR = 10.0
# Rolling window of recent normal grad norms; a spike needs this many to compare against.
GRAD_WINDOW = 100
GRAD_MIN_SAMPLES = 20

# A rank whose step time stays above this multiple of the other ranks' median for
# STRAGGLER_SECONDS (by the ranks' own clocks) is a straggler.
STRAGGLER_FACTOR = 1.5
STRAGGLER_SECONDS = 60.0
# Each rank's step time is the median of its last few points, so one slow step (a checkpoint,
# a GC pause) does not count.
STRAGGLER_SMOOTHING = 5

# Throughput (points of all ranks pooled) below DROP_FACTOR of the baseline median, for
# the median of the last DROP_RECENT points, is a drop; back above RECOVER_FACTOR ends it.
DROP_FACTOR = 0.5
RECOVER_FACTOR = 0.8
DROP_BASELINE = 50
DROP_RECENT = 10


@dataclass(frozen=True)
class Anomaly:
    kind: str
    severity: str
    message: str
    job_id: int
    round_number: int
    key: str  # stable for the episode: ingest uses it to store the event once
    data: dict[str, Any]


@dataclass
class StepEpisode:
    """Tracks one kind of trouble by step number; ``observe`` says when a new episode starts."""

    last_bad: int = -1
    last_good: int = -1
    start: int = -1

    def observe(self, step: int, bad: bool) -> bool:
        if not bad:
            self.last_good = max(self.last_good, step)
            return False
        new = self.start < 0 or (self.last_good > self.last_bad and step > self.last_good)
        self.last_bad = max(self.last_bad, step)
        if new:
            self.start = step
        return new


# Medians are recomputed every so many points, not on each: at 50,000 points/s the detectors
# must cost a few microseconds a point. A spike or drop is still caught at the point it happens;
# only the reference it is compared with lags by a few points.
GRAD_MEDIAN_EVERY = 10
DROP_CHECK_EVERY = 5
# Straggler checks run at most this often per rank, by the rank's clock.
STRAGGLER_CHECK_SECONDS = 1.0


@dataclass
class RankTiming:
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_SMOOTHING))
    current: float = 0.0
    checked_at: float = -math.inf
    slow_since: float | None = None
    reported: bool = False


@dataclass
class RoundState:
    loss: StepEpisode = field(default_factory=StepEpisode)
    grad: StepEpisode = field(default_factory=StepEpisode)
    grad_window: deque[float] = field(default_factory=lambda: deque(maxlen=GRAD_WINDOW))
    grad_median: float | None = None
    grad_added: int = 0
    throughput_added: int = 0
    timings: dict[int, RankTiming] = field(default_factory=dict)
    throughput: deque[float] = field(default_factory=lambda: deque(maxlen=DROP_BASELINE + DROP_RECENT))
    drop_baseline: float | None = None  # frozen baseline while a drop episode is open
    drop_episodes: int = 0


class AnomalyDetector:
    """Feed it stored points in arrival order; it returns the anomalies that start an episode."""

    def __init__(self) -> None:
        self.rounds: dict[tuple[int, int], RoundState] = {}
        self._last: tuple[tuple[int, int], RoundState] | None = None

    def forget_job(self, job_id: int) -> None:
        """Drop a job's state (ingest calls this once the job has ended)."""
        for key in [k for k in self.rounds if k[0] == job_id]:
            del self.rounds[key]
        self._last = None

    def jobs(self) -> set[int]:
        """The jobs some state is kept for."""
        return {job_id for job_id, _ in self.rounds}

    def observe_rows(
        self, rows: Iterable[tuple[int, int, int, int, int, str, float, float]]
    ) -> list[Anomaly]:
        """``observe`` for stored metric rows (job, round, rank, seq, step, name, value, t), in
        order; rows of names no detector watches are skipped at the cost of a set lookup."""
        found = []
        watched = _WATCHED
        for job_id, round_number, rank, _seq, step, name, value, t in rows:
            if name in watched:
                anomaly = self.observe(job_id, round_number, rank, step, name, value, t)
                if anomaly is not None:
                    found.append(anomaly)
        return found

    def observe(
        self, job_id: int, round_number: int, rank: int, step: int, name: str, value: float, t: float
    ) -> Anomaly | None:
        if name == LOSS_NAME:
            return self._loss(job_id, round_number, rank, step, value)
        if name == GRAD_NORM_NAME:
            return self._grad(job_id, round_number, rank, step, value)
        if name in STEP_TIME_NAMES:
            return self._step_time(job_id, round_number, rank, step, value, t)
        if name in THROUGHPUT_NAMES:
            return self._throughput(job_id, round_number, step, value)
        return None

    def _state(self, job_id: int, round_number: int) -> RoundState:
        key = (job_id, round_number)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        state = self.rounds.get(key)
        if state is None:
            # A new round supersedes the job's older ones; their state is no longer useful.
            for old in [k for k in self.rounds if k[0] == job_id and k[1] < round_number]:
                del self.rounds[old]
            self._last = None
            state = self.rounds[key] = RoundState()
        self._last = (key, state)
        return state

    def _loss(self, job_id: int, round_number: int, rank: int, step: int, value: float) -> Anomaly | None:
        state = self._state(job_id, round_number)
        if not state.loss.observe(step, not math.isfinite(value)):
            return None
        return Anomaly(
            kind="loss_not_finite",
            severity="error",
            message=f"Loss became {value} at step {step} (rank {rank}).",
            job_id=job_id,
            round_number=round_number,
            key=f"anomaly:loss:{job_id}:{round_number}:{step}",
            data={"step": step, "rank": rank, "value": str(value)},
        )

    def _grad(self, job_id: int, round_number: int, rank: int, step: int, value: float) -> Anomaly | None:
        state = self._state(job_id, round_number)
        window = state.grad_window
        median = state.grad_median
        spike = median is not None and math.isfinite(value) and value > GRAD_SPIKE_FACTOR * median
        if not spike and math.isfinite(value):
            # Spikes stay out of the window so that a burst of them cannot raise the bar.
            window.append(value)
            state.grad_added += 1
            if len(window) >= GRAD_MIN_SAMPLES and (
                median is None or state.grad_added % GRAD_MEDIAN_EVERY == 0
            ):
                state.grad_median = statistics.median(window)
        if not state.grad.observe(step, spike) or median is None:
            return None
        return Anomaly(
            kind="gradient_spike",
            severity="warning",
            message=(
                f"Gradient norm {value:.4g} at step {step} (rank {rank}) is "
                f"{value / median:.1f}x the rolling median {median:.4g}."
            ),
            job_id=job_id,
            round_number=round_number,
            key=f"anomaly:grad:{job_id}:{round_number}:{step}",
            data={"step": step, "rank": rank, "value": value, "median": median},
        )

    def _step_time(
        self, job_id: int, round_number: int, rank: int, step: int, value: float, t: float
    ) -> Anomaly | None:
        if not math.isfinite(value):
            return None
        state = self._state(job_id, round_number)
        timing = state.timings.get(rank)
        if timing is None:
            timing = state.timings[rank] = RankTiming()
        timing.recent.append(value)
        if t - timing.checked_at < STRAGGLER_CHECK_SECONDS:
            return None
        timing.checked_at = t
        timing.current = statistics.median(timing.recent)
        others = [tm.current for r, tm in state.timings.items() if r != rank and tm.recent]
        if not others:
            return None
        median = statistics.median(others)
        if timing.current <= STRAGGLER_FACTOR * median:
            timing.slow_since = None
            timing.reported = False
            return None
        if timing.slow_since is None:
            timing.slow_since = t
        if timing.reported or t - timing.slow_since < STRAGGLER_SECONDS:
            return None
        timing.reported = True
        return Anomaly(
            kind="straggler",
            severity="warning",
            message=(
                f"Rank {rank} is a straggler: step time {timing.current:.3g}s is "
                f"{timing.current / median:.1f}x the other ranks' median {median:.3g}s "
                f"for {t - timing.slow_since:.0f}s (at step {step})."
            ),
            job_id=job_id,
            round_number=round_number,
            key=f"anomaly:straggler:{job_id}:{round_number}:{rank}:{timing.slow_since:.3f}",
            data={"step": step, "rank": rank, "step_time": timing.current, "median": median},
        )

    def _throughput(self, job_id: int, round_number: int, step: int, value: float) -> Anomaly | None:
        if not math.isfinite(value):
            return None
        state = self._state(job_id, round_number)
        history = state.throughput
        history.append(value)
        state.throughput_added += 1
        if len(history) < DROP_BASELINE + DROP_RECENT or state.throughput_added % DROP_CHECK_EVERY:
            return None
        values = list(history)
        recent = statistics.median(values[-DROP_RECENT:])
        if state.drop_baseline is not None:
            if recent >= RECOVER_FACTOR * state.drop_baseline:
                state.drop_baseline = None
            return None
        baseline = statistics.median(values[:-DROP_RECENT])
        if baseline <= 0 or recent >= DROP_FACTOR * baseline:
            return None
        state.drop_baseline = baseline
        state.drop_episodes += 1
        return Anomaly(
            kind="throughput_drop",
            severity="warning",
            message=(
                f"Throughput dropped to {recent:.4g} at step {step}, "
                f"{100 * recent / baseline:.0f}% of the recent {baseline:.4g}."
            ),
            job_id=job_id,
            round_number=round_number,
            key=f"anomaly:throughput:{job_id}:{round_number}:{step}:{state.drop_episodes}",
            data={"step": step, "throughput": recent, "baseline": baseline},
        )
