"""Membership planning: pure functions from a snapshot of the cluster to a job's next round.

No database, no ORM, no messages. Given what the controller knows, as plain dataclasses
(console/jobs/plans.py; console/jobs/snapshot.py builds them), these say which nodes the next
round has, in which node-rank order, with which GPUs, why, and which ranks of the previous round
stop. Applying a plan (rows, state, commands, events) is console/jobs/rounds.py's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from console.core.states import RoundReason
from console.jobs.plans import Hold, JobView, NodeView, Placement, Plan, Process, Snapshot, WorkerPlan

__all__ = [
    "Hold",
    "JobView",
    "NodeView",
    "Placement",
    "Plan",
    "Process",
    "Regroup",
    "Snapshot",
    "WorkerPlan",
    "assign_gpus",
    "carried",
    "choose",
    "needs_growth",
    "order_members",
    "place_processes",
    "plan_round",
    "plan_workers",
    "preemption_victims",
    "recovery_in_place",
    "regroup_workers",
    "replace_workers",
    "with_processes",
]


def order_members(previous: Sequence[int], chosen: Iterable[NodeView]) -> list[NodeView]:
    """Nodes that stay keep their relative order (so node rank 0 stays put); new ones follow by name."""
    rank = {pk: index for index, pk in enumerate(previous)}
    chosen = list(chosen)
    staying = sorted((n for n in chosen if n.id in rank), key=lambda n: rank[n.id])
    joining = sorted((n for n in chosen if n.id not in rank), key=lambda n: n.name)
    return staying + joining


def assign_gpus(job: JobView, members: Sequence[NodeView]) -> tuple[Placement, ...]:
    """Node ranks in order, each with the lowest free GPUs of its node (none for CPU jobs)."""
    need = job.gpus_per_node
    return tuple(
        Placement(node.id, rank, tuple(node.free_gpus[:need]) if need else (), nproc=job.nproc_per_node)
        for rank, node in enumerate(members)
    )


def place_processes(ps_count: int, workers: int, nodes: int) -> tuple[tuple[Process, ...], ...]:
    """A parameter-server round's processes on ``nodes`` nodes (by node rank): the coordinator,
    then PS 0..M-1, then workers 0..N-1, dealt round-robin from node rank 0. The coordinator and
    the PS come first, so their places depend on M and the node count only, not on N."""
    processes = [Process("coordinator", 0, 0)]
    processes += [Process("ps", i, 1 + i) for i in range(ps_count)]
    processes += [Process("worker", j, 1 + ps_count + j) for j in range(workers)]
    dealt: list[list[Process]] = [[] for _ in range(nodes)]
    for process in processes:
        dealt[process.rank % nodes].append(process)
    return tuple(tuple(share) for share in dealt)


def with_processes(job: JobView, placements: tuple[Placement, ...]) -> tuple[Placement, ...]:
    """``placements`` with each node's processes for a parameter-server job (as is otherwise).
    A node that would get none is left out (more nodes than processes)."""
    if not job.parameter_server or not placements:
        return placements
    shares = place_processes(job.ps_count, job.workers, len(placements))
    return tuple(
        Placement(p.node_id, p.node_rank, p.gpus, share, nproc=len(share))
        for p, share in zip(placements, shares, strict=True)
        if share
    )


@dataclass(frozen=True)
class Regroup:
    """A parameter-server round's worker role resized in place: processes added (by node
    position in node-rank order) and worker indexes removed. The PS and the coordinator stay."""

    add: tuple[tuple[int, Process], ...]
    remove: tuple[int, ...]


def regroup_workers(
    shares: Sequence[Sequence[Process]], live: Sequence[int], free: Sequence[int], count: int
) -> Regroup | None:
    """How to bring the round's live workers (indexes ``live``) to ``count``: shrinking removes
    the highest indexes; growing deals new workers (indexes and ranks after every one the round
    has had) to the node with the most ``free`` slots, the lowest node rank first. None when the
    round's nodes have no room for them."""
    if count <= len(live):
        return Regroup((), tuple(sorted(live, reverse=True)[: len(live) - count]))
    every = [p for share in shares for p in share]
    index = 1 + max((p.index for p in every if p.role == "worker"), default=-1)
    rank = 1 + max((p.rank for p in every), default=-1)
    room = list(free)
    added: list[tuple[int, Process]] = []
    for offset in range(count - len(live)):
        node = max(range(len(room)), key=lambda i: (room[i], -i), default=None)
        if node is None or room[node] <= 0:
            return None
        room[node] -= 1
        added.append((node, Process("worker", index + offset, rank + offset)))
    return Regroup(tuple(added), ())


def replace_workers(
    shares: Sequence[Sequence[Process]], live: Sequence[Sequence[int]], free: Sequence[int], count: int
) -> Regroup | None:
    """A hybrid round's worker change: every live worker (``live[i]``: indexes on node position
    i) is removed and ``count`` new ones start (indexes and ranks after every one the round has
    had; their dense group is new), dealt like ``regroup_workers`` over the ``free`` slots plus
    those the removed workers leave. The PS and the coordinator stay. None when there is no room."""
    removed = tuple(sorted(i for node in live for i in node))
    room = [f + len(node) for f, node in zip(free, live, strict=True)]
    grown = regroup_workers(shares, [], room, count)
    if grown is None:
        return None
    return Regroup(grown.add, removed)


def plan_workers(
    snap: Snapshot, reason: RoundReason, count: int, lost: int | None = None
) -> WorkerPlan | None:
    """Bring the job's current parameter-server round to ``count`` live workers in place: new
    ones on the round's nodes with room (a host whose part has ended takes none), removed ones
    stopped. In hybrid mode every live worker is replaced by ``count`` new ones in a new dense
    group (console/jobs/wiring.py wires it); ``lost``: the failed worker that broke it, out of
    the round too (``reason`` FAILURE: charged). None when the nodes have no room."""
    job = snap.job
    shares = job.processes
    running = [
        [p for p in share if p.running] if live else []
        for share, live in zip(shares, job.member_live, strict=True)
    ]
    workers = [[p.index for p in share if p.role == "worker"] for share in running]
    # The job's own processes are not in the snapshot's free capacity: a node's room is its
    # free slots less what runs there now.
    free = [
        snap.nodes[pk].free_slots - len(share) if live and pk in snap.nodes else 0
        for pk, share, live in zip(job.members, running, job.member_live, strict=True)
    ]
    if job.hybrid:
        regroup = replace_workers(shares, workers, free, count)
    else:
        regroup = regroup_workers(shares, [i for node in workers for i in node], free, count)
    if regroup is None:
        return None
    removed = set(regroup.remove) | ({lost} if lost is not None else set())
    joined = "replacement" if lost is not None else "resize"
    placements = []
    changed = []
    for position, (pk, share) in enumerate(zip(job.members, shares, strict=True)):
        after = [
            replace(p, removed=True) if p.role == "worker" and p.index in removed and not p.removed else p
            for p in share
        ]
        after += [replace(p, joined=joined) for at, p in regroup.add if at == position]
        if tuple(after) != share:
            changed.append(pk)
        nproc = max(1, sum(1 for p in after if not p.removed))
        placements.append(Placement(pk, position, processes=tuple(after), nproc=nproc))
    return WorkerPlan(
        reason=reason,
        round_number=job.round_number,
        workers=count,
        placements=tuple(placements),
        changed=tuple(changed),
        added=tuple(p.index for _, p in regroup.add),
        removed=tuple(sorted(removed)),
        charged=reason.charged,
        hybrid=job.hybrid,
        lost=lost,
    )


def choose(
    snap: Snapshot, reason: RoundReason, *, leaving: int | None = None, target: int | None = None
) -> list[NodeView] | None:
    """The next round's nodes for ``reason``: None when nothing should change, [] when the job
    must go back to the queue. ``leaving`` is the node a loss or drain removes; ``target`` the
    node count a preemption shrinks to."""
    job = snap.job
    if reason in (RoundReason.START, RoundReason.RESUME):
        placeable = snap.placeable()
        return placeable[: job.desired_nodes] if len(placeable) >= job.min_nodes else None
    if reason in (RoundReason.RESTART, RoundReason.FALLBACK):
        return snap.members() or None
    if reason is RoundReason.PREEMPTION:
        assert target is not None, "a preemption says how many nodes the job keeps"
        return snap.members()[:target]
    survivors = snap.survivors(leaving)
    if reason is RoundReason.FAILURE:
        return survivors if len(survivors) >= job.min_nodes else []
    if reason is RoundReason.DRAIN:
        return survivors if job.elastic and len(survivors) >= job.min_nodes else None
    if reason is RoundReason.NODE_LOSS:
        refilled = snap.fill(survivors, snap.free_fitting(leaving), job.desired_nodes)
        return refilled if len(refilled) >= job.min_nodes else []
    if reason is RoundReason.RESIZE and job.parameter_server and len(survivors) >= job.min_nodes:
        # Only the PS count is resized by a new round (workers change in place): same nodes.
        return survivors
    # RESIZE and AUTOSCALE converge on the desired count: shrinking drops the highest node ranks.
    if len(survivors) > job.desired_nodes:
        keep = survivors[: job.desired_nodes]
    else:
        keep = snap.fill(survivors, snap.free_fitting(), job.desired_nodes)
    if [n.id for n in keep] == list(job.members) or len(keep) < job.min_nodes:
        return None
    return keep


def plan_round(
    snap: Snapshot,
    reason: RoundReason,
    *,
    leaving: int | None = None,
    target: int | None = None,
    recover_in_place: bool = False,
) -> Plan | None:
    """The plan for ``reason``, or None when the job's membership should stay as it is.

    The job's current round as the snapshot has it: failed (broken like a lost node's), still
    running (an in-place round needs its ranks), and its failed ranks (a FAILURE).
    ``recover_in_place``: a rank failure or node loss of an in-place job keeps the survivors
    running (settings.INPLACE_RECOVERY); see :func:`recovery_in_place`.
    """
    chosen = choose(snap, reason, leaving=leaving, target=target)
    if chosen is None:
        return None
    members = order_members(snap.job.members, chosen)
    previous_running = snap.job.round_running
    plan = None
    if recover_in_place and members and previous_running:
        plan = recovery_in_place(snap, reason, members, snap.job.failed_ranks)
    if plan is None:
        broken = snap.job.round_failed or reason.breaks_previous
        kept = {n.id for n in members}
        if not members or broken:
            stop = snap.job.members
        else:
            stop = tuple(pk for pk in snap.job.members if pk not in kept)
        plan = Plan(
            reason=reason,
            placements=with_processes(snap.job, assign_gpus(snap.job, members)),
            stop=tuple(stop),
            stop_at_once=broken and bool(members),
            charged=reason.charged,
            carry_over=carried(snap.job, members)
            if snap.job.inplace and reason.may_be_inplace and previous_running and not broken
            else (),
        )
    if not snap.job.round_open:
        return replace(plan, stop=(), carry_over=())  # its ranks were stopped when it ended
    return replace(plan, carry_from=snap.job.round_number) if plan.inplace else plan


def recovery_in_place(
    snap: Snapshot, reason: RoundReason, members: Sequence[NodeView], failed_ranks: Sequence[int]
) -> Plan | None:
    """A rank failure or node loss of an in-place job: the ranks still alive carry over (the SDK
    survives a broken collective and waits for this round) and only the dead ranks start afresh
    on the nodes that stay; a lost node's ranks all leave (it is stopped at once). A failure is
    still charged. None when nothing survives (the restart path then applies)."""
    job = snap.job
    if not job.inplace or reason not in (RoundReason.FAILURE, RoundReason.NODE_LOSS):
        return None
    dead = set(failed_ranks)
    carry = tuple((old, new) for old, new in carried(job, members) if old not in dead)
    if not carry:
        return None
    kept = {n.id for n in members}
    return Plan(
        reason=reason,
        placements=with_processes(job, assign_gpus(job, members)),
        stop=tuple(pk for pk in job.members if pk not in kept),
        stop_at_once=True,
        charged=reason.charged,
        carry_over=carry,
    )


def carried(job: JobView, members: Sequence[NodeView]) -> tuple[tuple[int, int], ...]:
    """An in-place round's survivors: every rank of a node that stays, from its old global rank
    to its new one (a node keeps its local ranks; its node rank may move down)."""
    old_rank = {pk: index for index, pk in enumerate(job.members)}
    per_node = job.nproc_per_node
    return tuple(
        (old_rank[node.id] * per_node + local, new_rank * per_node + local)
        for new_rank, node in enumerate(members)
        if node.id in old_rank
        for local in range(per_node)
    )


def needs_growth(job: JobView) -> bool:
    return len(job.members) < job.desired_nodes


def preemption_victims(job: JobView, needed: int, running: Sequence[JobView]) -> list[tuple[int, int]]:
    """Which lower-priority elastic jobs shrink toward their MIN, and to how many nodes, so that
    ``job`` finds ``needed`` more nodes. ``running`` is in the order victims are chosen (lowest
    priority first, newest first within a priority). Returns (job id, nodes kept) pairs."""
    victims: list[tuple[int, int]] = []
    for victim in running:
        if needed <= 0:
            break
        spare = len(victim.members) - victim.min_nodes
        if victim.priority >= job.priority or spare <= 0:
            continue
        drop = min(spare, needed)
        victims.append((victim.id, len(victim.members) - drop))
        needed -= drop
    return victims
