"""Growing a parameter-server job's worker role past its initial count, end to end: a real
controller, three real agents and the built-in recsys-embedding workload with its default
``examples`` (fixed at submission from the job's initial worker count).

In hybrid mode the resize replaces the dense group (2 workers -> 3 new ones); in sync mode one
worker joins the synchronous step barrier, in async mode the shard queue. Either way the job keeps
training with 3 workers (each of them pushes) and succeeds, nothing charged.

Before the fix every new worker declared a dataset for 3 workers, the coordinator (2) refused it,
a hybrid job replaced its dense group over and over (uncharged) until an agent closed its part of
the round and ignored its member of the next group, and the job stalled; a sync or async job went
on with 2.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from console.cluster.models import Node
from console.core.states import JobState
from console.jobs.models import Allocation, Job
from tests.support.cluster import HEARTBEAT, Cluster
from tests.support.controller import wait_for

HYPERPARAMETERS = {
    "rows": 2000,
    "small_rows": 50,
    "batch_size": 64,
    "steps": 150,
    "shard_batches": 2,
    "eval_samples": 256,
    "log_every": 1000,
    "checkpoint_every": 0,
}
PUSHED = 10 * HYPERPARAMETERS["batch_size"]  # ten batches


def rank_dirs(cluster: Cluster, job: Job, role: str, index: int) -> list[Path]:
    """The rank directories of ``role`` ``index`` in the job's current round (one, once placed)."""
    found = []
    allocs = Allocation.objects.filter(round__job=job, round__number=job.round_number).select_related("node")
    for alloc in allocs:
        for local_rank, process in enumerate(alloc.processes):
            if process["role"] == role and process["index"] == index:
                base = cluster.root / "agents" / alloc.node.name / "rounds" / f"job-{job.pk}"
                found.append(base / f"round-{job.round_number}" / f"rank-{local_rank}")
    return found


def latest(path: Path, name: str) -> float | None:
    """The last value of metric ``name`` in a rank's telemetry file."""
    value = None
    if path.exists():
        for line in path.read_text().splitlines():
            record: dict[str, Any] = json.loads(line) if line.strip() else {}
            value = record.get("values", {}).get(name, value)
    return value


def examples(cluster: Cluster, job: Job, index: int) -> float:
    """The examples worker ``index`` has pushed (``worker_examples``: every 20 pushes or 5 s)."""
    job.refresh_from_db()
    pushed = [
        latest(d / "telemetry.jsonl", "worker_examples") for d in rank_dirs(cluster, job, "worker", index)
    ]
    return max((value or 0.0 for value in pushed), default=0.0)


def registered(cluster: Cluster, job: Job) -> float:
    """The workers holding a lease at the coordinator (``queue_workers``, every second here)."""
    (directory,) = rank_dirs(cluster, job, "coordinator", 0)
    return latest(directory / "telemetry.jsonl", "queue_workers") or 0.0


def live_workers(job: Job) -> list[int]:
    job.refresh_from_db()
    rows = [
        p
        for a in Allocation.objects.filter(round__job=job, round__number=job.round_number)
        for p in a.processes
        if p["role"] == "worker" and not p.get("removed")
    ]
    return sorted(int(p["index"]) for p in rows) or [-1]  # [-1]: not placed yet


def worker_process(cluster: Cluster, job: Job, index: int) -> psutil.Process:
    """Worker ``index``'s process: the agents' descendant whose stdout is its rank's log."""
    (directory,) = rank_dirs(cluster, job, "worker", index)
    stdout = str(directory / "stdout.log")
    for agent in cluster.agents.agents:
        for proc in agent.descendants():
            try:
                if any(f.path == stdout for f in proc.open_files()):
                    return proc
            except psutil.Error:
                continue
    raise AssertionError(f"no process writes {stdout}")


@pytest.mark.cluster
# (async mode grows the same way as sync, without the barrier: it passed here too, and is left out
# to keep the suite's time; the async resize path runs in test_ps_console.py)
@pytest.mark.parametrize("mode", ["hybrid", "sync"])
def test_growing_the_worker_role_keeps_training_with_every_worker(cluster: Cluster, mode: str) -> None:
    # Given three agents and a recsys-embedding PS job (1 PS, 2 workers) with default examples
    for name in ("node-a", "node-b", "node-c"):
        cluster.agents.start(name, heartbeat=HEARTBEAT, extra_args=["--slots", "3"])
    wait_for(lambda: Node.objects.filter(state="ONLINE").count() == 3, timeout=60, message="agents")
    body = {
        "name": f"{mode}-grow",
        "workload": "recsys-embedding",
        "strategy": "parameter_server",
        "roles": {"ps": {"count": 1, "mode": mode}, "worker": {"count": 2, "min": 1, "max": 4}},
        "nnodes": "3",
        "hyperparameters": HYPERPARAMETERS,
        # A long lease: the first workers are paused below while the new one joins.
        "env": {
            "TRAINYARD_PS_LEASE_S": "60",
            "TRAINYARD_PS_DENSE_SAVE_S": "0.5",
            "TRAINYARD_PS_STATS_EVERY_S": "1",
        },
        "grace_period": 10,
        "max_restarts": 2,
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.hyperparameters["examples"] == 150 * 64 * 2  # fixed now, from the 2 workers asked for

    # When both workers push, the operator grows the worker role to 3
    try:
        wait_for(
            lambda: all(examples(cluster, job, i) >= PUSHED for i in live_workers(job)),
            timeout=180,
            message="both workers pushing",
        )
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    paused = []
    if mode != "hybrid":
        # (The first two are paused until the third has registered, so the epoch is
        # not over before it starts however slow this machine is: the hold files of
        # test_ps_elastic_workers.py, for a built-in workload.)
        paused = [worker_process(cluster, job, i) for i in (0, 1)]
        for proc in paused:
            proc.send_signal(signal.SIGSTOP)
    response = cluster.api.post(
        f"/api/v1/jobs/{job.pk}/resize/", {"role": "worker", "count": 3}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["roles"]["worker"]["count"] == 3

    # Then three workers train in the same round: each of them pushes
    workers = live_workers(job)
    assert len(workers) == 3 and job.round_number == 1, workers
    try:
        if paused:
            wait_for(lambda: registered(cluster, job) >= 3, timeout=120, message="3 workers registered")
        for proc in paused:
            proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: all(examples(cluster, job, i) >= PUSHED for i in workers),
            timeout=180,
            message=f"workers {workers} pushing",
        )
    except AssertionError:
        raise AssertionError(cluster.diagnose(job)) from None
    finally:
        for proc in paused:
            proc.send_signal(signal.SIGCONT)
    # and the job succeeds, none of it charged as a restart
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)
    assert (job.round_number, job.restarts) == (1, 0), cluster.diagnose(job)
    assert not job.events.filter(kind__in=["ps.worker_lost", "ps.resize_failed"]).exists(), cluster.diagnose(
        job
    )
