"""Hang detection on a host: when a rank has stopped making progress, as pure decisions.

A rank's progress is its step counter where it reports one (the SDK's step cell, its metrics, or
TensorBoard scalars), and otherwise its process: CPU time advancing (more than CPU_ACTIVE_PERCENT
of a core), or, while it is idle, a Python stack that changes between samples. (A rank spinning a
core in one place forever is not caught without steps.) A rank is *stalled* once its last progress is older than its
threshold (``threshold``):

- ``timeout_s`` when the job sets one;
- after its first step: ``multiple`` x the median gap between its step reports, at least
  ``floor_s`` (a rank that reports every 10th step has gaps of 10 steps: the threshold follows what
  it reports, not its step time);
- before its first step, and for a script that reports no steps at all: ``first_step_s`` (start-up,
  data loading and compilation are slower than a step).

Ranks further apart than ``max_drift_steps`` steps are a hang too (``drifted``: the controller
checks it across hosts, from the heartbeats' ``rank_steps``). A stall is reported once; a rank that moves again is
watched afresh. hangwatch.py samples the ranks and acts on what ``judge`` returns.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.protocol import HangPolicy

DEFAULT_MULTIPLE = 10.0
# Below this a pause is not a hang, whatever the median gap: checkpoints, evaluation passes and a
# neighbour's burst on a shared host pause steps for tens of seconds without anything being wrong.
DEFAULT_FLOOR_S = 60.0
# Before the first step: imports, dataset preparation, compilation.
DEFAULT_FIRST_STEP_S = 300.0
ACTIONS = ("notify", "restart", "fail")
# A rank without step reports that uses less than this share of one core between two samples is
# idle. A gloo rank blocked in a collective uses ~0 (measured here); a training rank one core.
CPU_ACTIVE_PERCENT = 5.0
# The median of the last this-many gaps between step reports.
GAP_WINDOW = 64


@dataclass(frozen=True)
class Policy:
    timeout_s: float | None = None
    multiple: float = DEFAULT_MULTIPLE
    floor_s: float = DEFAULT_FLOOR_S
    first_step_s: float | None = None
    action: str = "notify"
    max_drift_steps: int = 0

    @classmethod
    def of(cls, spec: HangPolicy | Mapping[str, Any] | None) -> Policy:
        spec = spec or {}
        timeout = spec.get("timeout_s")
        first = spec.get("first_step_s")
        return cls(
            timeout_s=float(timeout) if timeout else None,
            multiple=float(spec.get("multiple") or DEFAULT_MULTIPLE),
            floor_s=float(spec.get("floor_s") or DEFAULT_FLOOR_S),
            first_step_s=float(first) if first else None,
            action=str(spec.get("action") or "notify"),
            max_drift_steps=int(spec.get("max_drift_steps") or 0),
        )

    def before_first_step(self) -> float:
        if self.first_step_s is not None:
            return self.first_step_s
        return self.timeout_s if self.timeout_s is not None else DEFAULT_FIRST_STEP_S


@dataclass
class RankWatch:
    """What is known of one rank's progress. Times are the caller's clock (monotonic)."""

    rank: int
    local_rank: int
    pid: int
    started_at: float
    step: int | None = None
    step_at: float | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAP_WINDOW))
    active_at: float = 0.0  # last CPU activity with a changing stack (ranks without steps)
    cpu_s: float | None = None
    sampled_at: float | None = None
    cpu_percent: float = 0.0
    stack: tuple[Any, ...] | None = None  # the main thread's frames at the last stack sample
    stack_at: float = 0.0
    reported: bool = False  # its current stall has been reported

    def __post_init__(self) -> None:
        self.active_at = self.active_at or self.started_at

    @property
    def last_progress(self) -> float:
        return self.step_at if self.step_at is not None else self.active_at

    def note_step(self, step: int | None, now: float) -> None:
        if step is None or (self.step is not None and step <= self.step):
            return
        if self.step_at is not None:
            self.gaps.append(now - self.step_at)
        self.step, self.step_at = step, now
        self.reported = False

    def note_cpu(self, cpu_s: float, now: float) -> bool:
        """A CPU sample; True when the rank used the CPU since the last one (busy), which is
        progress for a rank without step reports."""
        before, before_at = self.cpu_s, self.sampled_at
        self.cpu_s, self.sampled_at = cpu_s, now
        if before is None or before_at is None or now <= before_at:
            return False
        self.cpu_percent = max(0.0, 100.0 * (cpu_s - before) / (now - before_at))
        busy = self.cpu_percent >= CPU_ACTIVE_PERCENT
        if busy and self.step_at is None:
            # Its last activity was somewhere in the interval: counting from its start keeps a
            # frozen rank's stall from looking one interval younger than it is.
            self.active_at = max(self.active_at, before_at)
            self.reported = False
        return busy

    def note_stack(self, frames: tuple[Any, ...], now: float) -> None:
        """A stack sample of an idle rank without step reports: a changed stack is progress (it
        waits in one place, then in another)."""
        if self.stack is not None and frames != self.stack:
            self.active_at = now
            self.reported = False
        self.stack, self.stack_at = frames, now


def threshold(watch: RankWatch, policy: Policy) -> float:
    if watch.step_at is None:
        return policy.before_first_step()
    if policy.timeout_s is not None:
        return policy.timeout_s
    median = statistics.median(watch.gaps) if watch.gaps else 0.0
    return max(policy.floor_s, policy.multiple * median)


def stalled_for(watch: RankWatch, now: float) -> float:
    return max(0.0, now - watch.last_progress)


def wants_stack_sample(watch: RankWatch, policy: Policy, busy: bool, now: float) -> bool:
    """A rank without step reports that is idle is sampled a few times per threshold: it may be
    waiting in one place after another (progress), or in one place for good."""
    if watch.step_at is not None or busy:
        return False
    every = min(30.0, max(2.0, threshold(watch, policy) / 3))
    return now - watch.stack_at >= every


@dataclass(frozen=True)
class Verdict:
    reason: str  # "stall" | "drift"
    stalled: tuple[int, ...]  # global ranks
    threshold_s: float


def judge(watches: Sequence[RankWatch], policy: Policy, now: float) -> Verdict | None:
    """The ranks of one round on this host that are stalled and not yet reported; None when there
    is nothing to report. (Drift is the controller's to see: it has every host's steps.)"""
    stalled = [w for w in watches if not w.reported and stalled_for(w, now) > threshold(w, policy)]
    if not stalled:
        return None
    return Verdict("stall", tuple(w.rank for w in stalled), max(threshold(w, policy) for w in stalled))


def drifted(steps: Mapping[int, int], max_drift_steps: int) -> list[int]:
    """Ranks more than ``max_drift_steps`` behind the furthest (0: drift is not checked)."""
    if max_drift_steps <= 0 or len(steps) < 2:
        return []
    ahead = max(steps.values())
    return sorted(rank for rank, step in steps.items() if ahead - step > max_drift_steps)


def mark_reported(watches: Iterable[RankWatch], ranks: Iterable[int]) -> None:
    named = set(ranks)
    for watch in watches:
        if watch.rank in named:
            watch.reported = True
