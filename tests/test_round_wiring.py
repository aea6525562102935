"""Where a planned round's listeners go (console/jobs/wiring.py), decided without a database: every
port new to its node, the coordinator as a parameter-server round's master, a hybrid job's workers
in one dense group whose store sits on its rank 0's node."""

from __future__ import annotations

import random

from console.core.states import RoundReason
from console.jobs.planning import JobView, NodeView, Plan, Process, Snapshot, plan_round
from console.jobs.wiring import PORT_RANGE, dense_group, pick_port, wire


def node(pk: int, recent: frozenset[int] = frozenset(), slots: int = 4) -> NodeView:
    return NodeView(
        id=pk, name=f"n{pk}", takes_work=True, free_slots=slots, address=f"10.0.0.{pk}", recent_ports=recent
    )


def wired(job: JobView, *nodes: NodeView, seed: int = 0) -> Plan:
    snap = Snapshot(job, {n.id: n for n in nodes})
    plan = plan_round(snap, RoundReason.START)
    assert plan is not None
    return wire(snap, plan, random.Random(seed))


def test_a_port_is_never_one_its_node_held_lately_nor_one_given_out_in_the_round() -> None:
    low, high = PORT_RANGE
    every_but_two = frozenset(range(low, high)) - {low + 5, low + 9}
    crowded = node(1, every_but_two)
    picked = {pick_port(crowded, (), random.Random(seed)) for seed in range(40)}
    assert picked == {low + 5, low + 9}
    assert {pick_port(crowded, {low + 5}, random.Random(seed)) for seed in range(40)} == {low + 9}


def test_an_allreduce_round_listens_on_its_first_nodes_address_at_a_new_port() -> None:
    job = JobView(id=1, name="a", min_nodes=2, max_nodes=2, desired_nodes=2, nproc_per_node=2)
    held = frozenset(range(PORT_RANGE[0], PORT_RANGE[0] + 6000))
    plan = wired(job, node(1, held), node(2))
    assert plan.master_addr == "10.0.0.1" and plan.master_port not in held
    assert PORT_RANGE[0] <= plan.master_port < PORT_RANGE[1]
    assert [p.nproc for p in plan.placements] == [2, 2] and plan.world_size == 4
    assert all(not p.processes for p in plan.placements)


def test_a_parameter_server_rounds_master_is_its_coordinator_and_servers_on_one_node_differ() -> None:
    job = JobView(id=2, name="ps", min_nodes=2, max_nodes=2, desired_nodes=2, ps_count=3, workers=2)
    plan = wired(job, node(1), node(2))
    first, second = plan.placements
    coordinator = first.processes[0]
    assert coordinator.role == "coordinator" and plan.master_port == coordinator.port
    for place in plan.placements:
        ports = [p.port for p in place.processes if p.role != "worker"]
        assert None not in ports and len(set(ports)) == len(ports)
        assert all(p.port is None for p in place.processes if p.role == "worker")
    assert plan.world_size == 6 == sum(len(p.processes) for p in plan.placements)
    assert (first.nproc, second.nproc) == (3, 3)


def test_hybrid_workers_form_one_dense_group_by_index_with_its_store_on_worker_0s_node() -> None:
    job = JobView(
        id=3, name="hy", min_nodes=2, max_nodes=2, desired_nodes=2, ps_count=1, workers=3, hybrid=True
    )
    plan = wired(job, node(1), node(2))
    workers = sorted(
        (p for place in plan.placements for p in place.processes if p.role == "worker"), key=lambda p: p.index
    )
    (master,) = {p.dense_master for p in workers}
    assert [(p.index, p.dense_rank, p.dense_world) for p in workers] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]
    worker_0_node = next(place for place in plan.placements if workers[0] in place.processes)
    assert master is not None and master.startswith(f"10.0.0.{worker_0_node.node_id}:")
    port = int(master.rpartition(":")[2])
    assert port not in {p.port for p in worker_0_node.processes}  # not a server's port on that node
    assert {p.dense_master for place in plan.placements for p in place.processes if p.role != "worker"} == {
        None
    }
    # And the rows the allocations store carry the group (what the agents' launcher reads)
    assert workers[1].row() == {
        "role": "worker",
        "index": 1,
        "rank": workers[1].rank,
        "dense_rank": 1,
        "dense_world": 3,
        "dense_master": master,
    }
    assert Process.of_row(workers[1].row()) == workers[1]
    assert workers[0].ports() == {port} and workers[1].ports() == set()


def test_a_dense_group_of_new_workers_avoids_the_ports_its_node_holds() -> None:
    n1 = node(1)
    taken = set(range(PORT_RANGE[0], PORT_RANGE[1] - 1))
    (only,) = dense_group([(n1, Process("worker", 7, 9))], taken, random.Random(1))
    assert (only.dense_rank, only.dense_world, only.dense_master) == (0, 1, f"10.0.0.1:{PORT_RANGE[1] - 1}")


def test_a_requeue_plan_has_nothing_to_wire() -> None:
    job = JobView(id=4, name="q", min_nodes=2, max_nodes=2, desired_nodes=2, members=(1, 2))
    snap = Snapshot(job, {1: node(1)})
    plan = plan_round(snap, RoundReason.NODE_LOSS, leaving=2)
    assert plan is not None and plan.requeue
    assert wire(snap, plan) == plan


def test_a_round_that_ended_is_not_stopped_again_nor_carried_over() -> None:
    job = JobView(
        id=5,
        name="r",
        min_nodes=1,
        max_nodes=2,
        desired_nodes=2,
        members=(1,),
        round_number=4,
        round_open=False,
    )
    plan = plan_round(Snapshot(job, {1: node(1), 2: node(2)}), RoundReason.RESUME)
    assert plan is not None and plan.stop == () and not plan.inplace
    live = JobView(
        id=5, name="r", min_nodes=1, max_nodes=2, desired_nodes=2, members=(1,), round_number=4, inplace=True
    )
    grown = plan_round(Snapshot(live, {1: node(1), 2: node(2)}), RoundReason.AUTOSCALE)
    assert grown is not None and grown.inplace and grown.carry_from == 4
