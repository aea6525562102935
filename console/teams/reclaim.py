"""Reclaim, elastic first: which borrowing jobs give back how much so that a workspace gets its
nominal quota back. Pure: no database.

Only workspaces using more than their nominal quota in the pool give anything back, and never
more than they borrow. First every elastic job of theirs shrinks toward its minimum (in place
where its script can: the same membership change as an operator's resize); only when that is
not enough is a whole job preempted (checkpointed by its graceful stop, then requeued). The most
over-share workspace gives first; within one, the lowest priority, then the newest job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from console.teams.fairshare import Ledger


@dataclass(frozen=True)
class Holder:
    """A running job as reclaim sees it."""

    job_id: int
    workspace: str
    pool: str
    nodes: int
    min_nodes: int
    units_per_node: int
    priority: int = 0
    order: int = 0  # submission order: newer gives first

    @property
    def spare(self) -> int:
        return max(0, self.nodes - self.min_nodes)


@dataclass(frozen=True)
class Give:
    """``job_id`` keeps ``keep`` nodes (0: preempted, back to the queue)."""

    job_id: int
    workspace: str
    keep: int
    units: int  # what it gives back

    @property
    def preempts(self) -> bool:
        return self.keep == 0


def reclaim(
    ledger: Ledger,
    for_workspace: str,
    pool: str,
    needed_nodes: int,
    holders: Sequence[Holder],
    shrink: bool = True,
) -> list[Give]:
    """What borrowers give back so that ``needed_nodes`` more nodes' worth is free for a job of
    ``for_workspace`` within its quota, in the order to apply. ``shrink`` False: preemption only
    (the bench's comparison). Empty when the borrowers cannot free enough (nothing is taken then:
    a shrink that does not let the job start would be lost work)."""
    borrowed = {
        h.workspace: ledger.borrowed(h.workspace, pool)
        for h in holders
        if h.pool == pool and h.workspace != for_workspace
    }
    candidates = sorted(
        (h for h in holders if borrowed.get(h.workspace, 0) > 0),
        key=lambda h: (-ledger.share(h.workspace), h.priority, -h.order),
    )
    gives: list[Give] = []
    kept = {h.job_id: h.nodes for h in candidates}
    need = needed_nodes
    if shrink:
        for holder in candidates:
            if need <= 0:
                break
            room = borrowed[holder.workspace] // max(1, holder.units_per_node)
            drop = min(holder.spare, need, room)
            if drop <= 0:
                continue
            kept[holder.job_id] -= drop
            borrowed[holder.workspace] -= drop * holder.units_per_node
            gives.append(
                Give(holder.job_id, holder.workspace, kept[holder.job_id], drop * holder.units_per_node)
            )
            need -= drop
    for holder in candidates:
        if need <= 0:
            break
        if borrowed[holder.workspace] <= 0 or kept[holder.job_id] == 0:
            continue
        units = kept[holder.job_id] * holder.units_per_node
        already = next((g for g in gives if g.job_id == holder.job_id), None)
        if already is not None:
            gives.remove(already)
            units += already.units
        borrowed[holder.workspace] -= kept[holder.job_id] * holder.units_per_node
        need -= kept[holder.job_id]
        kept[holder.job_id] = 0
        gives.append(Give(holder.job_id, holder.workspace, 0, units))
    return gives if need <= 0 else []
