"""The RoundSpec an agent receives for its place in a round (workers/protocol.py's contract)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from console.jobs.models import Allocation, Job, Round
from workers import protocol


def run_id(job: Job) -> str:
    """torchrun's run id for the job: the same for all its rounds, unique across consoles and
    database resets (agents key checkpoint directories on it)."""
    return f"trainyard-job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}"


def ps_secret(job: Job) -> str:
    """The secret a parameter-server job's PS and coordinator demand of callers (workers/ps/auth.py).
    Derived from SECRET_KEY, not stored: every round gets the same one (a PS restarted in a later
    round and the workers of any round agree) and no migration is needed. Keyed on the run id, so a
    job id reused after a database reset gets another."""
    return salted_hmac("trainyard.ps-secret", run_id(job), algorithm="sha256").hexdigest()


def round_spec(
    job: Job, rnd: Round, alloc: Allocation, members: Sequence[Allocation] | None = None
) -> protocol.RoundSpec:
    """What the host of ``alloc`` is sent for ``rnd``. ``members``: every allocation of the round,
    with its node, when the caller has them (else they are read)."""
    if members is None:
        members = list(rnd.allocations.select_related("node"))
    bundle: protocol.BundleRef | None = None
    if job.bundle_id and job.bundle:
        base = settings.TRAINYARD_PUBLIC_URL.rstrip("/")
        bundle = {"sha256": job.bundle.sha256, "url": f"{base}/api/v1/bundles/{job.bundle.sha256}/archive/"}
    spec: protocol.RoundSpec = {
        "job_id": job.pk,
        "round": rnd.number,
        "run_id": run_id(job),
        "node_rank": alloc.node_rank,
        "nnodes": len(members),
        "nproc_per_node": job.nproc_per_node,
        "world_size": rnd.world_size,
        "master_addr": rnd.master_addr,
        "master_port": rnd.master_port,
        "workload": job.workload,
        "entrypoint": job.entrypoint,
        "args": [str(a) for a in job.args],
        "bundle": bundle,
        "workdir": job.workdir,
        "env": {str(k): str(v) for k, v in {**job.env, **job.secret_env}.items()},
        "hyperparameters": job.hyperparameters,
        "strategy": job.strategy,
        "precision": job.precision,
        "grad_accum_steps": job.grad_accum_steps,
        "gpu_indices": list(alloc.gpu_indices),
        "restart_count": rnd.number - 1,  # rounds are numbered from 1, one after the other
        "max_restarts": job.max_restarts,
        "grace_period": job.grace_period,
    }
    if alloc.node.interface:
        spec["interface"] = alloc.node.interface
    if rnd.inplace:
        spec["carry_over"] = {
            "from_round": int(rnd.carry_over["from_round"]),
            "ranks": {str(old): int(new) for old, new in rnd.carry_over["ranks"].items()},
        }
    if job.hang_policy:
        spec["hang"] = job.hang_policy  # type: ignore[typeddict-item]
    if job.inplace and settings.INPLACE_RECOVERY and not job.is_parameter_server:
        spec["recover_in_place"] = True
    if job.is_parameter_server and alloc.processes:
        spec["nproc_per_node"] = len(alloc.processes)
        spec["ps"] = ps_round(job, members, alloc)
    return spec


def ps_round(job: Job, members: Sequence[Allocation], alloc: Allocation) -> protocol.PsRound:
    """Where a parameter-server round's coordinator and PS listen, and this host's processes."""
    coordinator = ""
    addresses: dict[int, str] = {}
    workers = 0
    for other in members:
        host = other.node.address or "127.0.0.1"
        for process in other.processes:
            if process["role"] == "coordinator":
                coordinator = f"{host}:{process['port']}"
            elif process["role"] == "ps":
                addresses[process["index"]] = f"{host}:{process['port']}"
            elif not process.get("removed"):
                workers += 1
    return {
        "mode": str(job.roles.get("ps", {}).get("mode", "async")),
        "coordinator": coordinator,
        "addresses": [addresses[i] for i in sorted(addresses)],
        "worker_count": workers,
        "processes": [_process(p) for p in alloc.processes],
        "secret": ps_secret(job),
    }


def _process(row: dict[str, Any]) -> protocol.PsProcess:
    process: protocol.PsProcess = {"role": row["role"], "index": int(row["index"]), "rank": int(row["rank"])}
    if row.get("removed"):
        process["removed"] = True
    if "dense_rank" in row:
        process["dense_rank"] = int(row["dense_rank"])
        process["dense_world"] = int(row["dense_world"])
        process["dense_master"] = str(row["dense_master"])
    return process
