"""Parameter-server jobs in the console, decided without a database or processes: the roles a
spec gives (checked and normalised), where the coordinator, PS and workers go, and what the
agent starts for each local rank (role, index, addresses; which failures the round survives)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from console.core.states import RoundReason
from console.jobs import roles
from console.jobs.planning import (
    JobView,
    NodeView,
    Process,
    Regroup,
    Snapshot,
    place_processes,
    plan_round,
    plan_workers,
    regroup_workers,
    replace_workers,
)
from console.jobs.wiring import wire_workers
from workers.agent import launcher
from workers.agent.config import AgentConfig
from workers.protocol import PsProcess, RoundSpec
from workers.ps import contract


def ps_job(nodes: int = 2, ps: int = 2, workers: int = 3, members: tuple[int, ...] = ()) -> JobView:
    return JobView(
        id=9,
        name="ps",
        min_nodes=nodes,
        max_nodes=nodes,
        desired_nodes=nodes,
        members=members,
        ps_count=ps,
        workers=workers,
    )


def nodes(*slots: int) -> dict[int, NodeView]:
    return {
        i + 1: NodeView(id=i + 1, name=f"n{i}", takes_work=True, free_slots=s) for i, s in enumerate(slots)
    }


# --- roles ---------------------------------------------------------------------------------


def test_roles_are_normalised_with_defaults() -> None:
    assert roles.normalize({"ps": {"count": 2}, "worker": {"count": 3, "min": 1, "max": 8}}) == {
        "ps": {"count": 2, "mode": "async"},
        "worker": {"count": 3, "min": 1, "max": 8},
    }
    assert roles.normalize({"ps": {"count": 1, "mode": "sync"}, "worker": {"count": 2}})["worker"] == {
        "count": 2,
        "min": 1,
        "max": 2,
    }


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ([], "must be a mapping"),
        ({"worker": {"count": 1}}, "roles.ps is required"),
        ({"ps": {"count": 1}, "worker": {"count": 1}, "chief": {}}, "unknown role"),
        ({"ps": {"count": 0}, "worker": {"count": 1}}, "roles.ps.count must be between 1"),
        ({"ps": {"count": "2"}, "worker": {"count": 1}}, "whole number"),
        ({"ps": {"count": 1, "mode": "eventual"}, "worker": {"count": 1}}, "roles.ps.mode must be one of"),
        ({"ps": {"count": 1}, "worker": {"count": 5, "max": 4}}, "within min..max"),
        ({"ps": {"count": 1}, "worker": {"count": 2, "min": 3, "max": 2}}, "larger than"),
        ({"ps": {"count": 1, "size": 3}, "worker": {"count": 1}}, "unknown role field"),
    ],
)
def test_bad_roles_are_refused_with_the_field_named(given: object, fragment: str) -> None:
    with pytest.raises(roles.RolesError) as caught:
        roles.normalize(given)
    assert fragment.lower() in str(caught.value).lower()


def test_a_role_is_resized_within_its_range_only() -> None:
    normal = roles.normalize({"ps": {"count": 2}, "worker": {"count": 3, "min": 1, "max": 8}})
    assert roles.resized(normal, "worker", 5)["worker"]["count"] == 5
    assert roles.resized(normal, "worker", 5)["ps"] == normal["ps"]
    with pytest.raises(roles.RolesError, match=r"1\.\.8"):
        roles.resized(normal, "worker", 9)
    with pytest.raises(roles.RolesError, match="Unknown role"):
        roles.resized(normal, "chief", 1)


# --- placement -----------------------------------------------------------------------------


def test_processes_are_dealt_round_robin_with_the_servers_first() -> None:
    shares = place_processes(2, 3, 2)
    assert shares == (
        (Process("coordinator", 0, 0), Process("ps", 1, 2), Process("worker", 1, 4)),
        (Process("ps", 0, 1), Process("worker", 0, 3), Process("worker", 2, 5)),
    )
    # The servers' places do not depend on the worker count.
    for workers in (1, 4, 7):
        servers = [[p for p in share if p.role != "worker"] for share in place_processes(2, workers, 2)]
        assert servers == [[p for p in share if p.role != "worker"] for share in shares]


def test_a_ps_job_needs_room_for_its_share_of_processes_on_each_node() -> None:
    job = ps_job(nodes=2, ps=2, workers=3)  # 6 processes: 3 a node
    assert job.slots_per_node == 3
    assert plan_round(Snapshot(job, nodes(3, 2)), RoundReason.START) is None
    plan = plan_round(Snapshot(job, nodes(3, 4)), RoundReason.START)
    assert plan is not None
    assert [p.node_id for p in plan.placements] == [1, 2]
    assert [[(x.role, x.index) for x in p.processes] for p in plan.placements] == [
        [("coordinator", 0), ("ps", 1), ("worker", 1)],
        [("ps", 0), ("worker", 0), ("worker", 2)],
    ]


def test_an_allreduce_plan_has_no_processes() -> None:
    job = JobView(id=1, name="a", min_nodes=1, max_nodes=1, desired_nodes=1, nproc_per_node=2)
    plan = plan_round(Snapshot(job, nodes(2)), RoundReason.START)
    assert plan is not None and plan.placements[0].processes == ()


def test_a_failure_round_keeps_every_server_on_its_node() -> None:
    job = replace(ps_job(nodes=2, members=(2, 1)), round_failed=True)
    plan = plan_round(Snapshot(job, nodes(3, 3)), RoundReason.FAILURE)
    assert plan is not None and [p.node_id for p in plan.placements] == [2, 1]
    assert [x.role for x in plan.placements[0].processes] == ["coordinator", "ps", "worker"]


# --- what the agent starts -----------------------------------------------------------------


def spec(processes: list[PsProcess]) -> RoundSpec:
    return {
        "job_id": 3,
        "round": 2,
        "run_id": "run-3",
        "node_rank": 1,
        "nnodes": 2,
        "nproc_per_node": len(processes),
        "world_size": 6,
        "master_addr": "10.0.0.1",
        "master_port": 23000,
        "workload": "recsys-embedding",
        "entrypoint": "",
        "args": [],
        "bundle": None,
        "workdir": "",
        # A tunable the job may set, and the secret it may not (the round's wins).
        "env": {"TRAINYARD_PS_LEASE_S": "2.5", "TRAINYARD_PS_SECRET": "set-by-the-job"},
        "hyperparameters": {},
        "strategy": "parameter_server",
        "precision": "fp32",
        "grad_accum_steps": 1,
        "gpu_indices": [],
        "restart_count": 0,
        "max_restarts": 3,
        "grace_period": 5.0,
        "ps": {
            "mode": "async",
            "coordinator": "10.0.0.1:23000",
            "addresses": ["10.0.0.2:23001", "10.0.0.1:23002"],
            "worker_count": 3,
            "processes": processes,
            "secret": "the-jobs-ps-secret",
        },
    }


def test_each_local_rank_gets_its_role_and_the_addresses(tmp_path: Path) -> None:
    round_spec = spec([{"role": "ps", "index": 0, "rank": 1}, {"role": "worker", "index": 2, "rank": 5}])
    config = AgentConfig(
        name="n1",
        broker_url="redis://x",
        token="t",
        address="",
        slots=4,
        heartbeat=1.0,
        data_dir=tmp_path / "data",
        checkpoint_root=tmp_path / "ckpt",
    )
    files = launcher.RankFiles.for_rank(config, round_spec, 0)
    server = contract.from_environ(launcher.rank_env(config, round_spec, 0, files))
    assert (server.role, server.index, server.listen_address) == (contract.Role.PS, 0, "10.0.0.2:23001")
    assert server.coordinator == "10.0.0.1:23000" and server.lease_s == 2.5
    assert server.checkpoint_dir.endswith("/ps")
    assert server.secret == "the-jobs-ps-secret"
    worker_env = launcher.rank_env(config, round_spec, 1, files)
    worker = contract.from_environ(worker_env)
    assert (worker.role, worker.index, worker.worker_count) == (contract.Role.WORKER, 2, 3)
    assert worker.secret == "the-jobs-ps-secret"
    assert worker_env["WORLD_SIZE"] == "1" and worker_env["RANK"] == "5"
    assert launcher.global_rank(round_spec, 1) == 5
    assert launcher.rank_command(round_spec, None, 0).args == ("-m", "workers.ps.server")
    assert launcher.rank_command(round_spec, None, 1).args[:3] == (
        "-m",
        "workers.workloads",
        "recsys-embedding",
    )
    assert not launcher.survivable(round_spec, 0) and launcher.survivable(round_spec, 1)


def test_the_coordinator_runs_the_coordinator_module() -> None:
    round_spec = spec([{"role": "coordinator", "index": 0, "rank": 0}])
    assert launcher.rank_command(round_spec, None, 0).args == ("-m", "workers.ps.coordinator")
    assert not launcher.survivable(round_spec, 0)


# --- the worker role resized in place ------------------------------------------------------


def test_growing_workers_deals_them_to_the_roomiest_node_after_every_index_used() -> None:
    shares = place_processes(2, 3, 2)
    grown = regroup_workers(shares, live=[0, 2], free=[1, 2], count=4)  # worker 1 has ended
    assert grown == Regroup(add=((1, Process("worker", 3, 6)), (0, Process("worker", 4, 7))), remove=())
    assert regroup_workers(shares, live=[0, 1, 2], free=[0, 0], count=4) is None  # no room


def test_shrinking_workers_removes_the_highest_indexes() -> None:
    shares = place_processes(2, 3, 2)
    assert regroup_workers(shares, live=[0, 1, 2], free=[0, 0], count=1) == Regroup((), (2, 1))
    assert regroup_workers(shares, live=[0, 1, 2], free=[0, 0], count=3) == Regroup((), ())


def test_the_agent_starts_added_workers_and_stops_removed_ones() -> None:
    round_spec = spec(
        [
            {"role": "ps", "index": 0, "rank": 1},
            {"role": "worker", "index": 0, "rank": 3, "removed": True},
            {"role": "worker", "index": 3, "rank": 6},
        ]
    )
    assert launcher.regroup(round_spec, {0, 1}) == ([2], {1})
    assert launcher.regroup(round_spec, {0, 1, 2}) == ([], {1})
    assert launcher.regroup(round_spec, {0, 2}) == ([], set())  # started without the removed one
    assert launcher.removed(round_spec, 1) and not launcher.removed(round_spec, 2)


# --- hybrid mode: a worker change replaces the whole dense group ----------------------------


def test_hybrid_is_a_mode_the_console_takes() -> None:
    normal = roles.normalize({"ps": {"count": 1, "mode": "hybrid"}, "worker": {"count": 2}})
    assert normal["ps"] == {"count": 1, "mode": "hybrid"}


def test_a_hybrid_worker_change_replaces_every_worker_and_keeps_the_servers() -> None:
    shares = place_processes(2, 3, 2)  # node 0: coordinator, ps 1, worker 1; node 1: ps 0, workers 0, 2
    # Worker 1 failed (not live); workers 0 and 2 on node 1 are replaced with it, by 3 new ones.
    changed = replace_workers(shares, live=[[], [0, 2]], free=[1, 0], count=3)
    assert changed is not None
    assert changed.remove == (0, 2)
    assert [p for _, p in changed.add] == [
        Process("worker", 3, 6),
        Process("worker", 4, 7),
        Process("worker", 5, 8),
    ]
    assert sorted(node for node, _ in changed.add) == [0, 1, 1]  # the removed workers' slots count
    assert all(p.role == "worker" for _, p in changed.add)  # no coordinator or PS restarted
    assert replace_workers(shares, live=[[1], [0, 2]], free=[0, 0], count=4) is None  # no room


def test_a_hybrid_worker_gets_its_dense_group_and_the_servers_none(tmp_path: Path) -> None:
    round_spec = spec(
        [
            {"role": "ps", "index": 0, "rank": 1},
            {
                "role": "worker",
                "index": 4,
                "rank": 7,
                "dense_rank": 1,
                "dense_world": 3,
                "dense_master": "10.0.0.2:24567",
            },
        ]
    )
    config = AgentConfig(
        name="n1",
        broker_url="redis://x",
        token="t",
        address="",
        slots=4,
        heartbeat=1.0,
        data_dir=tmp_path / "data",
        checkpoint_root=tmp_path / "ckpt",
    )
    files = launcher.RankFiles.for_rank(config, round_spec, 0)
    worker = launcher.rank_env(config, round_spec, 1, files)
    assert (worker["RANK"], worker["WORLD_SIZE"]) == ("1", "3")
    assert (worker["MASTER_ADDR"], worker["MASTER_PORT"]) == ("10.0.0.2", "24567")
    server = launcher.rank_env(config, round_spec, 0, files)
    assert server["WORLD_SIZE"] == "1"


# --- a worker change planned from the snapshot (planning.plan_workers, wiring.wire_workers) --


def running_round(hybrid: bool = False, live: tuple[bool, bool] = (True, True)) -> JobView:
    """A 2-node round of coordinator, 2 PS and 3 workers (node 1: coordinator, PS 1, worker 1;
    node 2: PS 0, workers 0 and 2), worker 1 ended; ports on the servers."""
    shares = place_processes(2, 3, 2)
    ported = tuple(
        tuple(
            replace(
                p,
                port=21000 + p.rank if p.role != "worker" else None,
                ended=p.role == "worker" and p.index == 1,
            )
            for p in share
        )
        for share in shares
    )
    return replace(ps_job(members=(1, 2)), round_number=4, hybrid=hybrid, processes=ported, member_live=live)


def test_growing_workers_is_planned_from_the_snapshot_and_only_changed_hosts_hear() -> None:
    snap = Snapshot(running_round(), nodes(4, 4))  # node 1 runs 2 (worker 1 ended): 2 free
    plan = plan_workers(snap, RoundReason.RESIZE, 4)
    assert plan is not None and (plan.round_number, plan.charged, plan.hybrid) == (4, False, False)
    # 2 live workers (0, 2) -> 4: workers 3 and 4, after every index and rank the round has had
    assert plan.added == (3, 4) and plan.removed == ()
    # dealt to the node with the most room (node 1: 4 free less the 2 running there)
    assert [p.index for p in plan.placements[0].processes if p.joined == "resize"] == [3, 4]
    assert plan.changed == (1,) and [p.nproc for p in plan.placements] == [5, 3]
    # a host whose part of the round ended takes no new worker, and its workers count for none
    closed = Snapshot(running_round(live=(True, False)), nodes(8, 8))
    grown = plan_workers(closed, RoundReason.RESIZE, 2)
    assert grown is not None and grown.changed == (1,) and grown.added == (3, 4)
    assert plan_workers(Snapshot(running_round(), nodes(2, 3)), RoundReason.RESIZE, 4) is None  # no room
    # shrinking marks the highest live indexes removed
    shrunk = plan_workers(snap, RoundReason.RESIZE, 1)
    assert shrunk is not None and shrunk.removed == (2,) and shrunk.changed == (2,)
    assert [p.row().get("removed") for p in shrunk.placements[1].processes] == [None, None, True]


def test_a_broken_hybrid_group_is_replaced_charged_and_wired_on_its_lowest_new_workers_node() -> None:
    import random

    view = running_round(hybrid=True)
    node = NodeView(
        id=1, name="n0", takes_work=True, free_slots=4, address="10.0.0.1", recent_ports=frozenset({23000})
    )
    snap = Snapshot(view, {1: node, 2: replace(node, id=2, name="n1", address="10.0.0.2")})
    plan = plan_workers(snap, RoundReason.FAILURE, 3, lost=1)
    assert plan is not None and plan.charged and plan.lost == 1
    assert plan.removed == (0, 1, 2) and plan.added == (3, 4, 5)
    assert all(
        p.joined == "replacement" for place in plan.placements for p in place.processes if p.index >= 3
    )
    wired = wire_workers(snap, plan, random.Random(7))
    group = sorted(
        (p for place in wired.placements for p in place.processes if p.role == "worker" and p.index >= 3),
        key=lambda p: p.index,
    )
    assert [(p.dense_rank, p.dense_world) for p in group] == [(0, 3), (1, 3), (2, 3)]
    head = next(place for place in wired.placements if any(p.index == 3 for p in place.processes))
    (master,) = {p.dense_master for p in group}
    assert master is not None and master.startswith(f"{snap.nodes[head.node_id].address}:")
    port = int(master.rpartition(":")[2])
    others = {q for p in head.processes if p.role != "worker" or p.index < 3 for q in p.ports()}
    assert others and port not in others | {23000}
    # the old group's rows are kept, marked removed; the servers are untouched
    servers = [p for place in wired.placements for p in place.processes if p.role != "worker"]
    assert servers == [p for share in view.processes for p in share if p.role != "worker"]
