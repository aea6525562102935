"""Where a planned round's listeners go: pure functions, like console/jobs/planning.py.

A plan says which nodes and processes a round has; ``wire`` adds where they listen (and
``wire_workers`` does for the workers a parameter-server round gains in place): a port for
the coordinator and each PS, hybrid workers' dense (DDP) group and its store, rank 0's store
(MASTER_ADDR/MASTER_PORT; a parameter-server round's is its coordinator). Every port is new to
its node (``NodeView.recent_ports``: a torchrun restart that reused its store's port failed
with "Connection refused" and hung), and drawn from ``rng`` (tests pass a seeded one).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import replace

from console.cluster.network import PORT_RANGE
from console.jobs.planning import NodeView, Plan, Process, Snapshot, WorkerPlan

__all__ = ["PORT_RANGE", "dense_group", "pick_port", "wire", "wire_workers"]


def pick_port(node: NodeView, taken: Collection[int], rng: random.Random) -> int:
    """A listen port on ``node`` in PORT_RANGE, neither one it held lately nor one in ``taken``
    (those this round already gave out there)."""
    avoid = node.recent_ports | set(taken)
    for _ in range(64):  # the range is mostly free: a few draws find a port
        port = rng.randrange(*PORT_RANGE)
        if port not in avoid:
            return port
    free = sorted(set(range(*PORT_RANGE)) - avoid)
    return rng.choice(free) if free else rng.randrange(*PORT_RANGE)


def dense_group(
    workers: Sequence[tuple[NodeView, Process]], taken: Collection[int], rng: random.Random
) -> list[Process]:
    """Hybrid mode: ``workers`` (each with its node) made one dense (DDP) group, by worker index:
    dense ranks in that order, the store on dense rank 0's node at a port not in ``taken`` (the
    ports that node's processes hold in the round)."""
    if not workers:
        return []
    ordered = sorted(workers, key=lambda member: member[1].index)
    head = ordered[0][0]
    master = f"{head.address}:{pick_port(head, taken, rng)}"
    return [
        replace(process, dense_rank=rank, dense_world=len(ordered), dense_master=master)
        for rank, (_, process) in enumerate(ordered)
    ]


def wire(snap: Snapshot, plan: Plan, rng: random.Random | None = None) -> Plan:
    """``plan`` with where its listeners are: a port for the coordinator and each PS, hybrid
    workers' dense group, and rank 0's store (a parameter-server round's is its coordinator)."""
    if plan.requeue:
        return plan
    rng = rng or random.Random()
    nodes = snap.nodes
    taken: dict[int, set[int]] = {}
    placements = []
    for place in plan.placements:
        held = taken.setdefault(place.node_id, set())
        processes = []
        for process in place.processes:
            if process.role != "worker":
                port = pick_port(nodes[place.node_id], held, rng)
                held.add(port)
                process = replace(process, port=port)
            processes.append(process)
        placements.append(replace(place, processes=tuple(processes)))
    workers = [
        (nodes[place.node_id], process)
        for place in placements
        for process in place.processes
        if process.role == "worker"
    ]
    if snap.job.hybrid and workers:
        head = min(workers, key=lambda member: member[1].index)[0]
        grouped = {p.index: p for p in dense_group(workers, taken.get(head.id, set()), rng)}
        placements = [
            replace(
                place,
                processes=tuple(
                    grouped.get(p.index, p) if p.role == "worker" else p for p in place.processes
                ),
            )
            for place in placements
        ]
    head_place = placements[0]
    head = nodes[head_place.node_id]
    master_port = head_place.processes[0].port if head_place.processes else None
    return replace(
        plan,
        placements=tuple(placements),
        master_addr=head.address,
        master_port=master_port or pick_port(head, (), rng),
    )


def wire_workers(snap: Snapshot, plan: WorkerPlan, rng: random.Random | None = None) -> WorkerPlan:
    """A hybrid job's new workers made one dense group: its store on the lowest new worker's
    node, at a port none of that node's processes in the round hold nor held lately. Workers
    added to an async or sync round listen nowhere: ``plan`` as is."""
    new = [
        (place, p)
        for place in plan.placements
        for p in place.processes
        if p.role == "worker" and p.index in plan.added
    ]
    if not plan.hybrid or not new:
        return plan
    rng = rng or random.Random()
    head = min(new, key=lambda member: member[1].index)[0]
    held = {port for p in head.processes for port in p.ports()}
    grouped = {
        p.index: p for p in dense_group([(snap.nodes[place.node_id], p) for place, p in new], held, rng)
    }
    placements = tuple(
        replace(
            place,
            processes=tuple(
                grouped.get(p.index, p) if p.index in plan.added and p.role == "worker" else p
                for p in place.processes
            ),
        )
        for place in plan.placements
    )
    return replace(plan, placements=placements)
