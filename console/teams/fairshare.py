"""Quotas, borrowing and fair share: pure decisions, no database (like Kueue's ClusterQueues).

A pool's workspaces form its cohort. Each one has a nominal quota in the pool (GPUs, or CPU
slots for a CPU pool); what one leaves idle the others may borrow, each up to its borrowing
limit. Among workspaces that borrow, the pool is shared by weight: the next job tried is the
head of the workspace with the lowest dominant share (what it borrows over the pool's size,
over its weight, the largest over its pools), jobs within their nominal quota first. A pool
without quotas is today's strict priority order: every job is within quota there, and one job
that does not fit holds up the jobs after it. A workspace that needs its nominal quota back
reclaims it from borrowers: console/teams/reclaim.py.

console/jobs/scheduler.py builds a ``Ledger`` from the rows each tick and asks it; the bench
(bench/sched/run.py) and tests/test_fair_share.py ask it directly.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class QuotaView:
    """A workspace's quota in a pool: nominal units, and at most ``borrowing_limit`` more
    (None: as much as is idle)."""

    nominal: int = 0
    borrowing_limit: int | None = None


@dataclass(frozen=True)
class PoolView:
    """A pool as a decision sees it: its size in units (GPUs or CPU slots of the nodes that take
    work) and its quotas by workspace (none: no quota is enforced)."""

    name: str
    capacity: int
    quotas: Mapping[str, QuotaView] = field(default_factory=dict)

    @property
    def enforced(self) -> bool:
        return bool(self.quotas)


@dataclass(frozen=True)
class Ask:
    """A pending job: what it needs to start (units at its minimum size) in which pool."""

    job_id: int
    workspace: str
    pool: str
    units: int
    priority: int = 0
    order: int = 0  # submission order (its id will do)
    name: str = ""


class Why(StrEnum):
    WITHIN_QUOTA = "within quota"
    BORROWING = "borrowing"
    OVER_QUOTA = "over quota"
    POOL_FULL = "pool full"


@dataclass(frozen=True)
class Verdict:
    why: Why
    message: str

    @property
    def admissible(self) -> bool:
        return self.why in (Why.WITHIN_QUOTA, Why.BORROWING)

    @property
    def reclaims(self) -> bool:
        """Within its nominal quota: it may take back what others borrowed of it."""
        return self.why is Why.WITHIN_QUOTA


class Ledger:
    """Each workspace's use of each pool, what it may take and its fair share; changed as the
    tick admits jobs (``charge``) and shrinks or preempts them (``release``)."""

    def __init__(
        self,
        pools: Iterable[PoolView],
        used: Mapping[tuple[str, str], int],
        weights: Mapping[str, int],
    ) -> None:
        self.pools = {p.name: p for p in pools}
        self.used: dict[tuple[str, str], int] = dict(used)
        self.weights = dict(weights)

    def pool_used(self, pool: str) -> int:
        return sum(units for (_, p), units in self.used.items() if p == pool)

    def use(self, workspace: str, pool: str) -> int:
        return self.used.get((workspace, pool), 0)

    def quota(self, workspace: str, pool: str) -> QuotaView:
        found = self.pools.get(pool)
        return found.quotas.get(workspace, QuotaView()) if found is not None else QuotaView()

    def borrowed(self, workspace: str, pool: str) -> int:
        return max(0, self.use(workspace, pool) - self.quota(workspace, pool).nominal)

    def enforced(self, pool: str) -> bool:
        found = self.pools.get(pool)
        return found is not None and found.enforced

    def check(self, ask: Ask) -> Verdict:
        """May ``ask`` start now as far as quotas go, and why (room on nodes is the caller's)."""
        if not self.enforced(ask.pool):
            return Verdict(Why.WITHIN_QUOTA, "no quota in this pool")
        quota = self.quota(ask.workspace, ask.pool)
        after = self.use(ask.workspace, ask.pool) + ask.units
        unit = "GPU(s)"  # the message's unit is the caller's to change; GPUs read best
        if after <= quota.nominal:
            return Verdict(Why.WITHIN_QUOTA, f"within quota ({after} of {quota.nominal} {unit})")
        over = after - quota.nominal
        if quota.borrowing_limit is not None and over > quota.borrowing_limit:
            return Verdict(
                Why.OVER_QUOTA,
                f"Over quota: {ask.workspace} would use {after} in pool {ask.pool}, its quota is "
                f"{quota.nominal} and it may borrow {quota.borrowing_limit} more",
            )
        idle = self.pools[ask.pool].capacity - self.pool_used(ask.pool)
        if ask.units > idle:
            return Verdict(
                Why.POOL_FULL,
                f"Pool {ask.pool} full: {idle} idle, {ask.units} needed beyond quota "
                f"({quota.nominal}) of {ask.workspace}",
            )
        return Verdict(Why.BORROWING, f"borrowing {over} over its quota of {quota.nominal}")

    def charge(self, workspace: str, pool: str, units: int) -> None:
        self.used[(workspace, pool)] = self.use(workspace, pool) + units

    def release(self, workspace: str, pool: str, units: int) -> None:
        self.used[(workspace, pool)] = max(0, self.use(workspace, pool) - units)

    def share(self, workspace: str) -> float:
        """Dominant resource share: the largest, over the pools, of what it borrows there over
        the pool's size; over its weight (Kueue's fair sharing)."""
        dominant = 0.0
        for name, pool in self.pools.items():
            if pool.enforced and pool.capacity:
                dominant = max(dominant, self.borrowed(workspace, name) / pool.capacity)
        return dominant / max(1, self.weights.get(workspace, 1))


@dataclass
class _Lane:
    """One workspace's pending jobs in one pool, best first (priority, then submission)."""

    workspace: str
    pool: str
    asks: list[Ask]
    at: int = 0

    @property
    def head(self) -> Ask | None:
        return self.asks[self.at] if self.at < len(self.asks) else None


class FairQueue:
    """Pending jobs in the order a tick tries them: by pool, the lane (workspace) with the
    lowest dominant share first (those within quota before borrowers), by priority then
    submission within a lane. ``next()`` gives the next job; the caller then says ``placed`` (its
    units are charged) or ``blocked`` (its lane waits behind it; in a pool without quotas the
    whole pool does, as the strict priority order always did)."""

    def __init__(self, ledger: Ledger, asks: Sequence[Ask]) -> None:
        self.ledger = ledger
        lanes: dict[tuple[str, str], list[Ask]] = {}
        for ask in asks:
            key = (ask.pool, ask.workspace) if ledger.enforced(ask.pool) else (ask.pool, "")
            lanes.setdefault(key, []).append(ask)
        self.lanes = [
            _Lane(ws, pool, sorted(found, key=lambda a: (-a.priority, a.order)))
            for (pool, ws), found in lanes.items()
        ]
        self.heap: list[tuple[tuple[int, float, int, int], int, int]] = []
        self.version = [0] * len(self.lanes)
        for index in range(len(self.lanes)):
            self._push(index)
        self.behind: dict[int, Ask] = {}  # job id -> the job its lane waits behind

    def _key(self, lane: _Lane) -> tuple[int, float, int, int]:
        head = lane.head
        assert head is not None
        verdict = self.ledger.check(head)
        tier = 0 if verdict.reclaims else 1
        share = self.ledger.share(head.workspace) if self.ledger.enforced(head.pool) else 0.0
        return (tier, share, -head.priority, head.order)

    def _push(self, index: int) -> None:
        lane = self.lanes[index]
        if lane.head is None:
            return
        self.version[index] += 1
        heapq.heappush(self.heap, (self._key(lane), self.version[index], index))

    def __iter__(self) -> Iterator[Ask]:
        return self

    def __next__(self) -> Ask:
        while self.heap:
            key, version, index = heapq.heappop(self.heap)
            lane = self.lanes[index]
            if version != self.version[index] or lane.head is None:
                continue
            fresh = self._key(lane)
            if fresh != key:  # the ledger moved since it was pushed: back in its place
                self.version[index] += 1
                heapq.heappush(self.heap, (fresh, self.version[index], index))
                continue
            self._current = index
            return lane.head  # type: ignore[return-value]
        raise StopIteration

    def placed(self, ask: Ask, units: int | None = None) -> None:
        self.ledger.charge(ask.workspace, ask.pool, ask.units if units is None else units)
        self._advance()

    def skipped(self) -> None:
        """The current job is passed over (over quota): the lane's next job is tried."""
        self._advance()

    def blocked(self) -> None:
        """The current job cannot start: its lane's later jobs wait behind it."""
        lane = self.lanes[self._current]
        head = lane.head
        assert head is not None
        for later in lane.asks[lane.at + 1 :]:
            self.behind[later.job_id] = head
        lane.at = len(lane.asks)
        self.version[self._current] += 1

    def _advance(self) -> None:
        self.lanes[self._current].at += 1
        self._push(self._current)
