"""A parameter-server job run by the console end to end: a real controller, two real agents,
the PS runtime's coordinator, PS and workers started by the agents with their roles. A worker
SIGKILLed mid-run costs nothing but its shard and a worker added by a resize joins the same
round, with the same PS processes throughout; a PS SIGKILLed is a rank failure: the next round's
PS resume from their checkpoints and the job succeeds."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from django.utils import timezone
from torch import nn

from console.cluster.models import Node
from console.core.states import JobState
from console.jobs import actions, failures, reports, scheduler
from console.jobs.models import Job
from console.jobs.spec import ps_secret
from tests.support.cluster import HEARTBEAT, Cluster
from tests.support.controller import wait_for
from tests.support.decisions import Decide, failing_exit, make_node, stop
from tests.support.jobs import submitted_ps_job
from tests.support.ps import COUNT_WORKER, HYBRID_WORKER

EXAMPLES = 4000
SHARD = 200
BATCH = 50


def worker_exit(local_rank: int, rank: int, code: int | None = 0, signal: str | None = None) -> Any:
    return {**failing_exit(rank=rank, code=code, signal=signal), "local_rank": local_rank, "error": ""}


def test_the_controller_places_the_roles_and_sends_each_host_its_processes(decide: Decide) -> None:
    a, b = make_node("a", slots=3), make_node("b", slots=3)
    job = submitted_ps_job()
    started = decide(scheduler.tick).to_agents()
    rnd = job.rounds.get()
    ports = {(p["role"], p["index"]): p.get("port") for x in rnd.allocations.all() for p in x.processes}
    specs = {queue: kwargs["spec"] for _, queue, kwargs in started}
    assert set(specs) == {"node.a", "node.b"}
    layout = specs["node.a"]["ps"]
    assert layout.pop("secret") == specs["node.b"]["ps"]["secret"] == ps_secret(job)
    assert layout == {
        "mode": "async",
        "coordinator": f"{a.address}:{rnd.master_port}",
        "addresses": [f"{b.address}:{ports['ps', 0]}", f"{a.address}:{ports['ps', 1]}"],
        "worker_count": 3,
        "processes": [
            {"role": "coordinator", "index": 0, "rank": 0},
            {"role": "ps", "index": 1, "rank": 2},
            {"role": "worker", "index": 1, "rank": 4},
        ],
    }
    assert specs["node.b"]["ps"]["processes"] == [
        {"role": "ps", "index": 0, "rank": 1},
        {"role": "worker", "index": 0, "rank": 3},
        {"role": "worker", "index": 2, "rank": 5},
    ]
    assert (specs["node.a"]["nproc_per_node"], rnd.world_size) == (3, 6)
    assert len({ports["ps", 0], ports["ps", 1], ports["coordinator", 0]}) == 3


def test_workers_ending_change_no_round_and_the_last_one_ends_the_job(decide: Decide) -> None:
    make_node("a", slots=3), make_node("b", slots=3)
    job = submitted_ps_job()
    decide(scheduler.tick)

    # A worker SIGKILLed: an event, nothing sent, the round goes on
    lost = decide(reports.rank_exited, "a", job.pk, 1, worker_exit(2, 4, code=None, signal="SIGKILL"))
    assert lost.sent() == [] and lost.kinds() == ["ps.worker_lost"]
    job.refresh_from_db()
    assert job.round_number == 1 and job.rounds.get().state == "starting" and job.job_state.is_active

    # The other two finish: the second ends the job and stops the servers on both hosts
    assert decide(reports.rank_exited, "b", job.pk, 1, worker_exit(1, 3)).sent() == []
    done = decide(reports.rank_exited, "b", job.pk, 1, worker_exit(2, 5))
    assert done.to_agents() == [stop(job, 1, "a", 12.0), stop(job, 1, "b", 12.0)]
    assert done.kinds() == ["job.succeeded"]
    assert done.events[0].message == "Succeeded in round 1: 2 of 3 worker(s) finished"
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


def test_a_ps_failure_or_every_worker_failing_is_a_rank_failure(decide: Decide) -> None:
    make_node("a", slots=3), make_node("b", slots=3)
    job = submitted_ps_job(workers=1)  # 4 processes: a has the coordinator and PS 1, b PS 0 and worker 0
    decide(scheduler.tick)
    failed = decide(reports.rank_exited, "b", job.pk, 1, worker_exit(0, 1, code=None, signal="SIGKILL"))
    assert failed.kinds() == ["rank.failed"]
    assert job.rounds.get().state == "settling"
    # Once a is heard from, the failure is charged: round 2 on the same nodes, every process in its place
    Node.objects.filter(name="a").update(last_heartbeat=timezone.now())
    restarted = decide(failures.settle_failed_rounds)
    assert restarted.kinds() == ["round.failure"]
    job.refresh_from_db()
    assert (job.round_number, job.restarts) == (2, 1)
    layout = {
        a.node.name: [(p["role"], p["index"]) for p in a.processes]
        for a in job.rounds.get(number=2).allocations.all()
    }
    assert layout == {"a": [("coordinator", 0), ("ps", 1)], "b": [("ps", 0), ("worker", 0)]}

    other = submitted_ps_job(workers=1)
    Node.objects.update(slots=6)
    decide(scheduler.tick)
    other.refresh_from_db()
    last = decide(reports.rank_exited, "b", other.pk, 1, worker_exit(1, 3, code=1))
    assert last.kinds() == ["ps.worker_lost", "rank.failed"]


def test_the_worker_role_is_resized_in_place(decide: Decide) -> None:
    make_node("a", slots=4), make_node("b", slots=3)
    job = submitted_ps_job(workers=3)  # a: coordinator, PS 1, worker 1; b: PS 0, workers 0 and 2
    decide(scheduler.tick)

    grown = decide(actions.resize_role, job.pk, "worker", 4, None)
    ((name, queue, kwargs),) = grown.to_agents()  # only a gets the round again, with worker 3
    assert (name, queue, kwargs["spec"]["round"]) == ("trainyard.agent.start_round", "node.a", 1)
    assert kwargs["spec"]["ps"]["processes"][-1] == {"role": "worker", "index": 3, "rank": 6}
    assert kwargs["spec"]["ps"]["worker_count"] == 4 and kwargs["spec"]["nproc_per_node"] == 4
    assert grown.kinds() == ["ps.workers_resized", "job.resize_requested"]
    job.refresh_from_db()
    assert (job.round_number, job.role_count("worker")) == (1, 4) and job.rounds.get().world_size == 7

    shrunk = decide(actions.resize_role, job.pk, "worker", 2, None)
    assert sorted(q for _, q, _ in shrunk.to_agents()) == ["node.a", "node.b"]  # workers 3 and 2 go
    removed = [p for a in job.rounds.get().allocations.all() for p in a.processes if p.get("removed")]
    assert sorted(p["index"] for p in removed) == [2, 3]
    job.refresh_from_db()
    assert job.round_number == 1 and job.rounds.get().world_size == 5

    # The two workers left finishing end the job; the removed ones are not waited for
    decide(reports.rank_exited, "b", job.pk, 1, worker_exit(1, 3))
    done = decide(reports.rank_exited, "a", job.pk, 1, worker_exit(2, 4))
    assert done.kinds() == ["job.succeeded"]

    with pytest.raises(actions.ControlError, match="only live jobs"):
        actions.resize_role(job.pk, "worker", 3, None)
    with pytest.raises(actions.InvalidRequest, match=r"1\.\.8"):
        actions.resize_role(submitted_ps_job().pk, "worker", 9, None)


def test_a_hybrid_worker_failure_replaces_every_worker_in_a_new_dense_group(decide: Decide) -> None:
    a, b = make_node("a", slots=4), make_node("b", slots=3)
    job = submitted_ps_job(
        workers=3, mode="hybrid"
    )  # a: coordinator, PS 1, worker 1; b: PS 0, workers 0 and 2
    started = decide(scheduler.tick).to_agents()
    specs = {queue: kwargs["spec"] for _, queue, kwargs in started}
    (dense_master,) = {
        p["dense_master"] for s in specs.values() for p in s["ps"]["processes"] if "dense_master" in p
    }
    assert dense_master.startswith(f"{b.address}:")  # worker 0's host
    assert [
        (p["index"], p["dense_rank"], p["dense_world"]) for p in specs["node.b"]["ps"]["processes"][1:]
    ] == [
        (0, 0, 3),
        (2, 2, 3),
    ]
    servers = {
        (p["role"], p["index"], p.get("port"))
        for x in job.rounds.get().allocations.all()
        for p in x.processes
        if p["role"] != "worker"
    }

    # Worker 1 dies: every worker is replaced by a new dense group, the servers stay as they were
    lost = decide(reports.rank_exited, "a", job.pk, 1, worker_exit(2, 4, code=None, signal="SIGKILL"))
    assert lost.kinds() == ["ps.worker_group_replaced"]
    assert sorted(q for _, q, _ in lost.to_agents()) == ["node.a", "node.b"]
    rnd = job.rounds.get()
    rows = [p for x in rnd.allocations.all() for p in x.processes]
    assert sorted(p["index"] for p in rows if p.get("removed")) == [0, 1, 2]
    new = sorted(
        (p for p in rows if p["role"] == "worker" and not p.get("removed")), key=lambda p: p["index"]
    )
    assert [(p["index"], p["dense_rank"], p["dense_world"]) for p in new] == [(3, 0, 3), (4, 1, 3), (5, 2, 3)]
    assert new[0]["dense_master"] != dense_master and new[0]["dense_master"].startswith(f"{a.address}:")
    assert {(p["role"], p["index"], p.get("port")) for p in rows if p["role"] != "worker"} == servers
    job.refresh_from_db()
    assert job.round_number == 1 and job.job_state.is_active

    # The old group's exits change nothing; the new group finishing ends the job
    assert decide(reports.rank_exited, "b", job.pk, 1, worker_exit(1, 3, code=1)).kinds() == []
    decide(reports.rank_exited, "a", job.pk, 1, worker_exit(3, 6))
    decide(reports.rank_exited, "b", job.pk, 1, worker_exit(3, 7))
    done = decide(reports.rank_exited, "a", job.pk, 1, worker_exit(4, 8))
    assert done.kinds() == ["job.succeeded"]

    # A resize of a hybrid job's workers replaces them too
    other = submitted_ps_job(workers=2, mode="hybrid")
    Node.objects.update(slots=8)
    decide(scheduler.tick)
    resized = decide(actions.resize_role, other.pk, "worker", 3, None)
    assert resized.kinds() == ["ps.worker_group_replaced", "job.resize_requested"]
    rows = [p for x in other.rounds.get().allocations.all() for p in x.processes if p["role"] == "worker"]
    assert sorted(p["index"] for p in rows if p.get("removed")) == [0, 1]
    assert sorted(p["dense_rank"] for p in rows if not p.get("removed")) == [0, 1, 2]


def test_hybrid_group_replacements_are_charged_and_bounded_by_max_restarts(decide: Decide) -> None:
    make_node("a", slots=6), make_node("b", slots=6)
    job = submitted_ps_job(workers=2, mode="hybrid")
    Job.objects.filter(pk=job.pk).update(max_restarts=1)
    decide(scheduler.tick)
    worker = {
        (p["index"]): (a.node.name, local_rank, p["rank"])
        for a in job.rounds.get().allocations.all()
        for local_rank, p in enumerate(a.processes)
        if p["role"] == "worker"
    }

    # A worker fails: its group is replaced, charged like a rank failure
    node, local_rank, rank = worker[0]
    replaced = decide(reports.rank_exited, node, job.pk, 1, worker_exit(local_rank, rank, code=1))
    assert replaced.kinds() == ["ps.worker_group_replaced"]
    assert replaced.events[0].data["charged"] is True
    assert "restart 1 of 1" in replaced.events[0].message
    job.refresh_from_db()
    assert (job.round_number, job.restarts, job.state) == (1, 1, JobState.STARTING)

    # A worker of the new group fails too: past max_restarts, the job fails and everything stops
    new = [
        (a.node.name, local_rank, p["rank"], p["index"])
        for a in job.rounds.get().allocations.all()
        for local_rank, p in enumerate(a.processes)
        if p["role"] == "worker" and not p.get("removed")
    ]
    node, local_rank, rank, index = new[0]
    exit = {**worker_exit(local_rank, rank, code=1), "error": "Traceback\nRuntimeError: boom"}
    failed = decide(reports.rank_exited, node, job.pk, 1, exit)
    assert failed.kinds() == ["job.failed"]
    assert sorted(q for _, q, _ in failed.to_agents()) == ["node.a", "node.b"]
    assert "RuntimeError: boom" in failed.events[0].message
    assert "replaced 1 time(s) already (max_restarts 1)" in failed.events[0].message
    job.refresh_from_db()
    assert job.state == JobState.FAILED and (job.failure["worker"], job.failure["rank"]) == (index, rank)


def test_a_worker_a_resize_started_that_fails_says_the_resize_did_not_take(decide: Decide) -> None:
    make_node("a", slots=4), make_node("b", slots=4)
    job = submitted_ps_job(workers=2, mode="sync")
    decide(scheduler.tick)
    decide(actions.resize_role, job.pk, "worker", 3, None)
    (alloc, local_rank, row) = next(
        (a, i, p)
        for a in job.rounds.get().allocations.all()
        for i, p in enumerate(a.processes)
        if p.get("joined")
    )
    assert (row["index"], row["joined"]) == (2, "resize")

    # The new worker ends with exit code 1 before it reported a push (its close reported 0 examples)
    from console.telemetry.models import Metric

    Metric.objects.create(
        job=job,
        round_number=1,
        rank=row["rank"],
        seq=1,
        step=0,
        name="worker_examples",
        value=0.0,
        time=timezone.now(),
    )
    exit = {**worker_exit(local_rank, row["rank"], code=1), "error": "PsClientError: FAILED_PRECONDITION"}
    lost = decide(reports.rank_exited, alloc.node.name, job.pk, 1, exit)
    assert lost.kinds() == ["ps.resize_failed"]
    assert lost.events[0].message == (
        f"The resize of the worker role did not take: worker 2 on {alloc.node.name}, started by it, ended "
        "with exit code 1 before it reported a push: PsClientError: FAILED_PRECONDITION; 2 of 3 worker(s) run"
    )
    assert (lost.events[0].data["running"], lost.events[0].data["asked"]) == (2, 3)
    # An original worker's loss is a worker lost, as before
    (alloc, local_rank, row) = next(
        (a, i, p)
        for a in job.rounds.get().allocations.all()
        for i, p in enumerate(a.processes)
        if p["role"] == "worker" and p["index"] == 0
    )
    other = decide(
        reports.rank_exited, alloc.node.name, job.pk, 1, worker_exit(local_rank, row["rank"], code=1)
    )
    assert other.kinds() == ["ps.worker_lost"] and other.events[0].message.endswith("; 1 of 3 worker(s) run")


def processes(cluster: Cluster, marker: str) -> list[psutil.Process]:
    found = []
    for agent in cluster.agents.agents:
        for proc in agent.descendants():
            try:
                if any(marker in part for part in proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                pass
    return found


@pytest.mark.cluster
def test_a_ps_job_survives_a_killed_worker_without_restarting_its_servers(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given two agents with room for the job's 5 processes (coordinator, 2 PS, 2 workers)
    for name in ("node-a", "node-b"):
        cluster.agents.start(name, heartbeat=HEARTBEAT, extra_args=["--slots", "4"])
    wait_for(lambda: Node.objects.filter(state="ONLINE").count() == 2, timeout=60, message="agents")

    # When a PS job of the count worker (tests/scripts/ps_count_worker.py) is submitted
    summary = tmp_path / "summary-{index}.json"
    body = {
        "name": "ps-e2e",
        "strategy": "parameter_server",
        "roles": {"ps": {"count": 2}, "worker": {"count": 2, "min": 1, "max": 4}},
        "nnodes": "2",
        "entrypoint": COUNT_WORKER,
        "workdir": str(Path(COUNT_WORKER).parent),
        "args": [
            str(summary),
            "--examples",
            str(EXAMPLES),
            "--shard-size",
            str(SHARD),
            "--batch-size",
            str(BATCH),
            "--sleep",
            "0.2",
        ],
        "env": {
            "TRAINYARD_PS_LEASE_S": "2",
            "TRAINYARD_PS_STATS_EVERY_S": "1",
            "TRAINYARD_PS_CHECKPOINT_EVERY_S": "1",
        },
        "grace_period": 10,
        "max_restarts": 1,
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])

    # Then both workers push (each wrote its first-push file)
    firsts = [Path(str(summary).replace("{index}", str(i)) + ".first") for i in range(2)]
    try:
        wait_for(lambda: all(f.exists() for f in firsts), timeout=120, message="both workers' first push")
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    servers = processes(cluster, "workers.ps.server") + processes(cluster, "workers.ps.coordinator")
    assert len(servers) == 3, [p.cmdline() for p in servers]
    rnd = job.rounds.get()
    roles = sorted((p["role"], p["index"]) for a in rnd.allocations.all() for p in a.processes)
    assert roles == [("coordinator", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]

    # When worker 1 is SIGKILLed mid-run
    victim = psutil.Process(json.loads(firsts[1].read_text())["pid"])
    os.kill(victim.pid, signal.SIGKILL)

    # Then the controller hears of the loss while the PS, the coordinator and worker 0 run on
    wait_for(lambda: job.events.filter(kind="ps.worker_lost").exists(), timeout=30, message="worker loss")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and all(p.is_running() for p in servers), cluster.diagnose(job)
    lost = job.events.get(kind="ps.worker_lost")
    assert lost.data["signal"] == "SIGKILL" and lost.data["worker"] == 1

    # When the operator resizes the worker role back to 2 through the API
    asked = time.time()
    response = cluster.api.post(
        f"/api/v1/jobs/{job.pk}/resize/", {"role": "worker", "count": 2}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["roles"]["worker"]["count"] == 2

    # Then a new worker (index 2) joins the same round and pushes, the servers untouched
    joined = Path(str(summary).replace("{index}", "2") + ".first")
    try:
        wait_for(joined.exists, timeout=60, message="the new worker's first push")
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    print(f"worker_join_s={json.loads(joined.read_text())['first_push_at'] - asked:.2f}")
    job.refresh_from_db()
    assert job.round_number == 1 and all(p.is_running() for p in servers), cluster.diagnose(job)

    # When PS 0 is then SIGKILLed (it has checkpointed: TRAINYARD_PS_CHECKPOINT_EVERY_S=1)
    port = next(
        p["port"] for a in rnd.allocations.all() for p in a.processes if p["role"] == "ps" and p["index"] == 0
    )
    (ps0,) = [
        p
        for p in servers
        if any(c.laddr.port == port for c in p.net_connections("tcp") if c.status == "LISTEN")
    ]
    os.kill(ps0.pid, signal.SIGKILL)

    # Then that is a rank failure: round 2 (failure) on the same nodes, its PS 0 restored from its
    # checkpoint, and the job succeeds there with the worker role as resized (2 workers)
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=180)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert (job.round_number, job.restarts) == (2, 1)
    failure = job.events.get(kind="rank.failed").data["cause"]
    assert failure["signal"] == "SIGKILL" and failure["round"] == 1
    second = job.rounds.get(number=2)
    assert second.reason == "failure"
    workers = sorted(
        p["index"] for a in second.allocations.all() for p in a.processes if p["role"] == "worker"
    )
    assert workers == [0, 1]
    assert job.events.get(kind="job.succeeded").message == "Succeeded in round 2: 2 of 2 worker(s) finished"
    restored = [
        path.read_text()
        for path in cluster.root.glob(f"agents/*/rounds/job-{job.pk}/round-2/rank-*/stdout.log")
        if "PS 0/2: restored version" in path.read_text()
    ]
    assert restored, "PS 0 did not restore its checkpoint in round 2"
    wait_for(lambda: not any(p.is_running() for p in servers), timeout=30, message="round 1's servers gone")


@pytest.mark.cluster
def test_a_hybrid_job_replaces_its_workers_and_they_carry_on_from_the_saved_dense_weights(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Given two agents and a hybrid job: 1 PS, 2 workers in one dense (DDP) group
    for name in ("node-a", "node-b"):
        cluster.agents.start(name, heartbeat=HEARTBEAT, extra_args=["--slots", "3"])
    wait_for(lambda: Node.objects.filter(state="ONLINE").count() == 2, timeout=60, message="agents")
    prefix = tmp_path / "worker-{index}"
    body = {
        "name": "hybrid-e2e",
        "strategy": "parameter_server",
        "roles": {"ps": {"count": 1, "mode": "hybrid"}, "worker": {"count": 2, "min": 1, "max": 4}},
        "nnodes": "2",
        "entrypoint": HYBRID_WORKER,
        "workdir": str(Path(HYBRID_WORKER).parent),
        "args": [
            str(prefix),
            "--examples",
            "3000",
            "--shard-size",
            "100",
            "--batch-size",
            "25",
            "--sleep",
            "0.1",
        ],
        "env": {"TRAINYARD_PS_LEASE_S": "2", "TRAINYARD_PS_DENSE_SAVE_S": "0.3"},
        "grace_period": 10,
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])

    def path(index: int, suffix: str) -> Path:
        return Path(str(prefix).replace("{index}", str(index)) + suffix)

    # When both workers push and rank 0 (worker 0) has saved the dense weights, worker 1 is SIGKILLed
    try:
        wait_for(
            lambda: path(1, ".first").exists() and path(0, ".saved.jsonl").exists(),
            timeout=120,
            message="training",
        )
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    servers = processes(cluster, "workers.ps.server") + processes(cluster, "workers.ps.coordinator")
    assert len(servers) == 2, [p.cmdline() for p in servers]
    pids = sorted(p.pid for p in servers)
    os.kill(json.loads(path(1, ".first").read_text())["pid"], signal.SIGKILL)

    # Then every worker is replaced (workers 2 and 3, a new dense group) in the same round, the
    # PS and the coordinator the same processes, and the job succeeds
    try:
        wait_for(
            lambda: path(2, ".first").exists() and path(3, ".first").exists(), timeout=90, message="new group"
        )
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    now = processes(cluster, "workers.ps.server") + processes(cluster, "workers.ps.coordinator")
    assert sorted(p.pid for p in now) == pids and all(p.is_running() for p in servers)
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert job.round_number == 1 and job.events.filter(kind="ps.worker_group_replaced").count() == 1

    # And the new group started from dense weights the old rank 0 saved after training, not from
    # its own init (seeded by its index) nor the first group's
    saved = [json.loads(line) for line in path(0, ".saved.jsonl").read_text().splitlines()]
    first = json.loads(path(0, ".loaded.json").read_text())
    loaded = [json.loads(path(i, ".loaded.json").read_text()) for i in (2, 3)]
    assert loaded[0] == loaded[1] and loaded[0] in saved and loaded[0] != first
    torch.manual_seed(102)
    fresh = nn.Linear(4, 1)
    assert loaded[0] != [p.detach().reshape(-1).tolist() for p in fresh.parameters()]
