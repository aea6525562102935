"""Goodput: a job's wall time split into productive step time and the badput that kept it from
training. A pure function of a ``Timeline`` (what console/telemetry/goodput_data.py reads from
rounds, metric tiles, checkpoints and events); no database here, so it is tested on scripted
timelines (tests/test_goodput.py).

The buckets (Google's ``ml-goodput-measurement`` and DLRover split badput the same way):

- ``productive``: between a round's first and last logged step, less what the others take;
- ``queued``: before the first round, and between a round sent back to the queue and the next;
- ``starting``: a first (or resumed-from-queue) round's launch to its first step;
- ``restoring``: after a failure (rank failure, node loss, operator restart): from the old round's
  last step to the new round's first (detection, settling, launch, checkpoint load);
- ``membership``: the same for a resize, growth, preemption or drain (in place or restarted);
- ``redone``: steps taken again after a failure (those since the checkpoint the new round resumed
  from), carved from the end of the failed round's productive span;
- ``checkpoint``: time the script blocked on a checkpoint (the SDK records it);
- ``data``: time between steps outside ``sdk.step`` (the SDK's ``data_wait_s``: fetching the next
  batch), a share of each round's productive time;
- ``hung``: from a ``job.hang`` event's last progress until steps resume or the round ends;
- ``ending``: after the last step of a job that ended (final checkpoint, teardown).

Plain scripts (no SDK, no logged steps) get the round-level part: queued, and each round's life by
its reason: with no step logged in any round, a round counts as productive from its launch until a
rank failed (then restoring until the next round) or it ended.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

BUCKETS = (
    "productive",
    "queued",
    "starting",
    "restoring",
    "membership",
    "redone",
    "checkpoint",
    "data",
    "hung",
    "ending",
)
BADPUT = BUCKETS[1:]

# Why a round started → the bucket its wait for a first step belongs to (RoundReason values).
_REASON_BUCKET = {
    "start": "starting",
    "resume": "starting",
    "failure": "restoring",
    "node_loss": "restoring",
    "restart": "restoring",
    "resize": "membership",
    "autoscale": "membership",
    "preemption": "membership",
    "drain": "membership",
}
# A new round for these reasons may redo steps already taken (it resumed from a checkpoint).
REDO_REASONS = frozenset({"failure", "node_loss", "restart"})
_REQUEUED = "requeued"


def reason_bucket(reason: str) -> str:
    return _REASON_BUCKET.get(reason, "membership")


@dataclass(frozen=True)
class RoundFacts:
    """One round as the goodput needs it; times are unix seconds."""

    number: int
    reason: str
    created: float
    ended: float | None = None
    outcome: str | None = None
    failed: float | None = None  # its first rank failure reported
    first_step: int | None = None
    first_step_time: float | None = None
    last_step: int | None = None
    last_step_time: float | None = None
    # Mean seconds per step the SDK timed (step_time_s), for the first step's own duration and
    # for steps redone when the round's own span cannot say (a single logged step).
    step_seconds: float | None = None
    # Share of a step's wall time spent between steps (data_wait_s / step_time_s), 0..1.
    data_share: float = 0.0
    world_size: int = 0

    @property
    def stepped(self) -> bool:
        return self.first_step_time is not None and self.last_step_time is not None

    def seconds_per_step(self) -> float | None:
        if (
            self.stepped
            and self.first_step is not None
            and self.last_step is not None
            and self.last_step > self.first_step
        ):
            assert self.first_step_time is not None and self.last_step_time is not None
            return (self.last_step_time - self.first_step_time) / (self.last_step - self.first_step)
        return self.step_seconds


@dataclass(frozen=True)
class Hang:
    """A ``job.hang`` event: detected at ``at``, no progress since ``since`` (when known)."""

    round_number: int
    at: float
    since: float | None = None


@dataclass(frozen=True)
class Timeline:
    created: float
    now: float
    finished: float | None = None
    running: bool = False  # the job's state is RUNNING (a tail after the last step is still training)
    rounds: tuple[RoundFacts, ...] = ()
    checkpoints: tuple[tuple[float, float], ...] = ()  # (recorded at, seconds blocked)
    hangs: tuple[Hang, ...] = ()


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    bucket: str
    data_share: float = 0.0  # of a productive segment: the part that waited on data

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Goodput:
    start: float
    end: float
    segments: list[Segment] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return max(0.0, self.end - self.start)

    def totals(self) -> dict[str, float]:
        totals = dict.fromkeys(BUCKETS, 0.0)
        for seg in self.segments:
            if seg.bucket == "productive" and seg.data_share:
                totals["data"] += seg.seconds * seg.data_share
                totals["productive"] += seg.seconds * (1 - seg.data_share)
            else:
                totals[seg.bucket] += seg.seconds
        return totals

    @property
    def ratio(self) -> float | None:
        """Productive over wall time; None for a job with no wall time yet."""
        return self.totals()["productive"] / self.wall if self.wall > 0 else None

    def clipped(self, start: float, end: float) -> Goodput:
        """The part between ``start`` and ``end`` (a window of the cluster's figure)."""
        lo, hi = max(start, self.start), min(end, self.end)
        if hi <= lo:
            return Goodput(lo, lo)
        segments = [
            Segment(max(s.start, lo), min(s.end, hi), s.bucket, s.data_share)
            for s in self.segments
            if s.end > lo and s.start < hi
        ]
        return Goodput(lo, hi, segments)

    def bins(self, count: int) -> list[dict[str, float]]:
        """``count`` equal slices of the wall time, each the seconds of every bucket in it (the
        job page's stacked bar over time)."""
        if count < 1 or self.wall <= 0:
            return []
        width = self.wall / count
        out = []
        for i in range(count):
            lo = self.start + i * width
            out.append(self.clipped(lo, lo + width).totals())
        return out

    def as_json(self, bins: int = 0) -> dict[str, object]:
        totals = self.totals()
        body: dict[str, object] = {
            "start": self.start,
            "end": self.end,
            "wall_seconds": self.wall,
            "goodput": self.ratio,
            "seconds": totals,
            "segments": [
                {"start": s.start, "end": s.end, "bucket": s.bucket, "data_share": s.data_share}
                for s in self.segments
            ],
        }
        if bins:
            body["bins"] = self.bins(bins)
        return body


def combine(parts: Iterable[Goodput]) -> dict[str, object]:
    """Several jobs' figures summed (the cluster's): goodput is productive over all wall time."""
    totals = dict.fromkeys(BUCKETS, 0.0)
    wall = 0.0
    jobs = 0
    for part in parts:
        if part.wall <= 0:
            continue
        jobs += 1
        wall += part.wall
        for bucket, seconds in part.totals().items():
            totals[bucket] += seconds
    return {
        "jobs": jobs,
        "wall_seconds": wall,
        "goodput": totals["productive"] / wall if wall > 0 else None,
        "seconds": totals,
    }


# --------------------------------------------------------------------------------------------
# The computation: every instant of [created, end) gets one bucket. Boundaries are collected,
# each elementary interval is labelled at its midpoint by the rules below (highest first), and
# neighbours with the same label are merged.


def compute(timeline: Timeline) -> Goodput:
    end = timeline.finished if timeline.finished is not None else timeline.now
    start = timeline.created
    if end <= start:
        return Goodput(start, start)
    rounds = sorted(timeline.rounds, key=lambda r: r.number)
    spans = _productive_spans(rounds)
    redone = _redone(rounds, spans)
    hung = _hung(timeline, rounds, end)
    checkpoints = sorted(
        (max(start, at - blocked), at) for at, blocked in timeline.checkpoints if blocked > 0
    )
    points = {start, end}
    for rnd in rounds:
        points.update(t for t in (rnd.created, rnd.ended, rnd.failed) if t is not None)
    for lo, hi in [*spans.values(), *redone, *hung, *checkpoints]:
        points.update((lo, hi))
    cuts = sorted(t for t in points if start <= t <= end)
    starts = [r.created for r in rounds]
    label = _Labeller(timeline, rounds, spans, redone, hung, checkpoints, starts, end)
    segments: list[Segment] = []
    for lo, hi in itertools.pairwise(cuts):
        if hi <= lo:
            continue
        bucket, share = label((lo + hi) / 2)
        if segments and segments[-1].bucket == bucket and segments[-1].data_share == share:
            last = segments[-1]
            segments[-1] = Segment(last.start, hi, bucket, share)
        else:
            segments.append(Segment(lo, hi, bucket, share))
    return Goodput(start, end, segments)


def _productive_spans(rounds: list[RoundFacts]) -> dict[int, tuple[float, float]]:
    """Each stepped round's [start of its first step, its last step]."""
    spans = {}
    for rnd in rounds:
        if not rnd.stepped:
            continue
        assert rnd.first_step_time is not None and rnd.last_step_time is not None
        per_step = rnd.seconds_per_step() or 0.0
        # The first step is logged when it ends; it began one step earlier (not before launch).
        begin = max(rnd.created, rnd.first_step_time - per_step)
        spans[rnd.number] = (begin, max(begin, rnd.last_step_time))
    return spans


def _redone(rounds: list[RoundFacts], spans: dict[int, tuple[float, float]]) -> list[tuple[float, float]]:
    """The end of each failed round's span that the next round took again."""
    out = []
    for before, after in itertools.pairwise(rounds):
        if after.reason not in REDO_REASONS or before.number not in spans:
            continue
        if before.last_step is None or after.first_step is None:
            continue
        steps = before.last_step - after.first_step + 1
        per_step = before.seconds_per_step()
        if steps <= 0 or not per_step:
            continue
        lo, hi = spans[before.number]
        out.append((max(lo, hi - steps * per_step), hi))
    return out


def _hung(timeline: Timeline, rounds: list[RoundFacts], end: float) -> list[tuple[float, float]]:
    by_number = {r.number: i for i, r in enumerate(rounds)}
    out = []
    for hang in timeline.hangs:
        i = by_number.get(hang.round_number)
        if i is None:
            continue
        rnd = rounds[i]
        window_end = rounds[i + 1].created if i + 1 < len(rounds) else end
        last = rnd.last_step_time
        if last is None or hang.at >= last:
            # No step after it: hung from the last progress until the round was replaced.
            since = hang.since if hang.since is not None else (last if last is not None else hang.at)
            out.append((min(since, hang.at), max(window_end, hang.at)))
        else:
            # Steps came again after it: hung from its last progress to the detection (at least).
            since = hang.since if hang.since is not None else hang.at
            out.append((min(since, hang.at), hang.at))
    return out


@dataclass
class _Labeller:
    timeline: Timeline
    rounds: list[RoundFacts]
    spans: dict[int, tuple[float, float]]
    redone: list[tuple[float, float]]
    hung: list[tuple[float, float]]
    checkpoints: list[tuple[float, float]]
    starts: list[float]
    end: float

    def __post_init__(self) -> None:
        self._checkpoint_starts = [lo for lo, _ in self.checkpoints]
        # The longest checkpoint bounds how far back a covering one can start.
        self._longest = max((hi - lo for lo, hi in self.checkpoints), default=0.0)

    def __call__(self, t: float) -> tuple[str, float]:
        if any(lo <= t < hi for lo, hi in self.hung):
            return "hung", 0.0
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return "queued", 0.0
        rnd = self.rounds[i]
        nxt = self.rounds[i + 1] if i + 1 < len(self.rounds) else None
        productive = self._in_span(t, i)
        if productive is not None:
            if any(lo <= t < hi for lo, hi in self.redone):
                return "redone", 0.0
            if self._in_checkpoint(t):
                return "checkpoint", 0.0
            return "productive", productive.data_share
        # Not stepping. Sent back to the queue: waiting for nodes again.
        if rnd.outcome == _REQUEUED and rnd.ended is not None and t >= rnd.ended:
            return "queued", 0.0
        span = self.spans.get(rnd.number)
        if span is None:
            if not self.spans:
                # A plain script: no step is ever logged, so only the round-level part is known.
                # A round runs from its launch until a rank failed (then the change to the next
                # round is restoring) or it ended.
                if rnd.failed is not None and t >= rnd.failed:
                    return (reason_bucket(nxt.reason) if nxt is not None else "ending"), 0.0
                if rnd.ended is not None and t >= rnd.ended and nxt is None:
                    return "ending", 0.0
                return "productive", 0.0
            return reason_bucket(rnd.reason), 0.0
        if t < span[0]:
            return reason_bucket(rnd.reason), 0.0
        # After this round's last step.
        if nxt is not None:
            return reason_bucket(nxt.reason), 0.0
        if self.timeline.running:
            return "productive", rnd.data_share
        return "ending", 0.0

    def _in_span(self, t: float, i: int) -> RoundFacts | None:
        """The round whose productive span holds ``t`` (an in-place round's predecessor steps on
        while its successor forms, so the previous round is checked too)."""
        for j in (i, i - 1):
            if j < 0:
                continue
            span = self.spans.get(self.rounds[j].number)
            if span is not None and span[0] <= t < span[1]:
                return self.rounds[j]
        return None

    def _in_checkpoint(self, t: float) -> bool:
        k = bisect.bisect_right(self._checkpoint_starts, t)
        for lo, hi in reversed(self.checkpoints[max(0, k - 64) : k]):
            if lo <= t < hi:
                return True
            if t - lo > self._longest:
                break
        return False
