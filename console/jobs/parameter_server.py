"""What a parameter-server worker's exit means for its job.

A worker's data shards are leased from the job's coordinator (workers/ps/coordinator.py): when a
worker dies its lease runs out and another worker does the shard again, and the PS apply each
batch's gradient once (pushes carry their (epoch, shard, batch) key). So a worker that ends, by
success or failure, changes no round: the agent keeps the PS and the other workers running
(workers/agent/launcher.py's ``survivable``) and the controller only counts. The job succeeds
once every worker of the round has ended and at least one finished its work; the PS and the
coordinator, which serve until told to stop, are then stopped (they write a final checkpoint).
A PS or coordinator that fails is a rank failure like any other: the round restarts and the PS
resume from their checkpoints. In hybrid mode a failed worker breaks its dense group: the group
is replaced in the same round through ``change_membership(FAILURE, workers=N, lost=i)``
(console/jobs/membership.py: planned, wired and applied like every other change), charged
against max_restarts; past them the job fails.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from console.core import events
from console.core.events import Severity
from console.core.states import JobState, RoundReason
from console.jobs.failures import describe, failed, record_failure
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job, Round
from console.jobs.rounds import finish_job
from workers import protocol


def process_of(alloc: Allocation, exit: protocol.RankExit) -> dict[str, Any] | None:
    """The allocation's process (role, index, rank) that ``exit`` reports, if it has one."""
    local_rank = exit.get("local_rank", -1)
    if 0 <= local_rank < len(alloc.processes):
        return dict(alloc.processes[local_rank])
    return None


def is_worker_exit(job: Job, alloc: Allocation, exit: protocol.RankExit) -> bool:
    process = process_of(alloc, exit) if job.is_parameter_server else None
    return process is not None and process["role"] == "worker"


def worker_tally(rnd: Round) -> tuple[int, int, int]:
    """(workers, ended, succeeded) of a parameter-server round, from the exits recorded so far."""
    workers = ended = succeeded = 0
    for alloc in rnd.allocations.all():
        exits = {e.get("local_rank"): e for e in alloc.exit_info.get("exits", [])}
        for local_rank, process in enumerate(alloc.processes):
            if process["role"] != "worker" or process.get("removed"):
                continue
            workers += 1
            exit = exits.get(local_rank)
            if exit is not None:
                ended += 1
                succeeded += not failed(exit)
    return workers, ended, succeeded


def is_hybrid(job: Job) -> bool:
    """Rows on the PS, the dense network all-reduced by the workers' own DDP group."""
    return bool(job.roles.get("ps", {}).get("mode") == "hybrid")


def worker_exited(job: Job, alloc: Allocation, exit: protocol.RankExit, now: datetime) -> None:
    """A worker of ``job``'s current round ended (its exit is recorded on ``alloc`` already).
    In hybrid mode a failed worker breaks its dense group: every worker is replaced by a new
    group (the PS keep the dense weights saved), and the old group's exits are ignored; each
    such replacement is charged against max_restarts, and past it the job fails."""
    process = process_of(alloc, exit)
    assert process is not None
    if process.get("removed"):
        return  # stopped by a resize or a worker change: its end changes nothing
    if failed(exit) and is_hybrid(job) and job.job_state.is_active:
        if job.restarts >= job.max_restarts:
            _fail_group(job, alloc, process, exit)
            return
        count = job.role_count("worker")
        if change_membership(job, RoundReason.FAILURE, workers=count, lost=int(process["index"])):
            return
        # no room for a new group: counted as a lost worker
    if failed(exit):
        _worker_lost(job, alloc, process, exit)
    _end_if_done(job, alloc, exit, now)


def _cause(alloc: Allocation, process: dict[str, Any], exit: protocol.RankExit) -> dict[str, Any]:
    return {
        "round": alloc.round.number,
        "node": alloc.node.name,
        "rank": exit.get("rank"),
        "local_rank": exit.get("local_rank"),
        "worker": process["index"],
        "exit_code": exit.get("exit_code"),
        "signal": exit.get("signal"),
        "error": (exit.get("error") or "")[-4000:],
    }


def _last_line(exit: protocol.RankExit) -> str:
    said = (exit.get("error") or "").strip().splitlines()
    return f": {said[-1][:300]}" if said else ""


def _fail_group(job: Job, alloc: Allocation, process: dict[str, Any], exit: protocol.RankExit) -> None:
    """A hybrid job's dense group broke once more than max_restarts allows: the job fails."""
    cause = _cause(alloc, process, exit)
    job.failure = cause
    finish_job(
        job,
        JobState.FAILED,
        f"Failed: worker {process['index']} on {alloc.node.name} ended with {describe(cause)}"
        f"{_last_line(exit)}; the dense group was replaced {job.restarts} time(s) already "
        f"(max_restarts {job.max_restarts})",
        severity=Severity.ERROR,
        cause=cause,
    )


def _worker_lost(job: Job, alloc: Allocation, process: dict[str, Any], exit: protocol.RankExit) -> None:
    """A failed worker the job goes on without: its shard goes back to the queue. One that a
    resize started and that never reported a push means the resize did not take."""
    cause = {"exit_code": exit.get("exit_code"), "signal": exit.get("signal")}
    workers, ended, _ = worker_tally(alloc.round)
    running = f"{workers - ended} of {job.role_count('worker')} worker(s) run"
    pushed = (int(process["rank"]), WORKER_METRICS["examples"])  # (a close reports 0 examples too)
    reported = (
        latest_values(job.pk, alloc.round.number, [pushed]) if process.get("joined") == "resize" else {}
    )
    never_pushed = process.get("joined") == "resize" and not (reported.get(pushed) or (0.0,))[0]
    if never_pushed:
        kind = "ps.resize_failed"
        message = (
            f"The resize of the worker role did not take: worker {process['index']} on "
            f"{alloc.node.name}, started by it, ended with {describe(cause)} before it reported a "
            f"push{_last_line(exit)}; {running}"
        )
    else:
        kind = "ps.worker_lost"
        message = (
            f"Worker {process['index']} on {alloc.node.name} ended with {describe(cause)}; its shard "
            f"goes back to the queue, the PS and the other workers carry on; {running}"
        )
    events.emit(
        kind,
        message,
        job=job,
        node=alloc.node,
        severity=Severity.ERROR if never_pushed else Severity.WARNING,
        worker=process["index"],
        exit_code=exit.get("exit_code"),
        signal=exit.get("signal"),
        running=workers - ended,
        asked=job.role_count("worker"),
    )


def end_if_done(job: Job, rnd: Round) -> None:
    """After the worker role shrank: the job succeeds if the workers left have all ended."""
    allocs = list(rnd.allocations.select_related("node"))
    if allocs:
        _end_if_done(job, allocs[0], None, timezone.now())


def _end_if_done(job: Job, alloc: Allocation, exit: protocol.RankExit | None, now: datetime) -> None:
    workers, ended, succeeded = worker_tally(alloc.round)
    if ended < workers:
        return
    if succeeded:
        finish_job(
            job,
            JobState.SUCCEEDED,
            f"Succeeded in round {alloc.round.number}: {succeeded} of {workers} worker(s) finished",
        )
    elif exit is not None:
        record_failure(job, alloc, exit, now)  # every worker failed: the round failed


def role_rows(job: Job, rnd: Round | None) -> list[dict[str, Any]]:
    """What the job page shows of each role: the count asked for, the processes of the current
    round still running (a worker that ended or was removed is not) and where they run."""
    where: dict[str, dict[str, list[int]]] = {"ps": {}, "worker": {}}
    if rnd is not None and not rnd.ended:
        for alloc in sorted(rnd.allocations.all(), key=lambda a: a.node_rank):
            ended = {e.get("local_rank") for e in alloc.exit_info.get("exits", [])}
            for local_rank, process in enumerate(alloc.processes):
                role = "ps" if process["role"] == "coordinator" else process["role"]
                if process.get("removed") or local_rank in ended or process["role"] == "coordinator":
                    continue
                where[role].setdefault(alloc.node.name, []).append(int(process["index"]))
    rows = []
    for role in ("ps", "worker"):
        spec = job.roles.get(role, {})
        placed = where[role]
        rows.append(
            {
                "role": role,
                "count": spec.get("count", 0),
                "range": f"{spec['min']}..{spec['max']}" if role == "worker" else "",
                "mode": spec.get("mode", "") if role == "ps" else "",
                "running": sum(len(v) for v in placed.values()),
                "where": "; ".join(
                    f"{node}: {', '.join(map(str, sorted(ix)))}" for node, ix in placed.items()
                ),
            }
        )
    return rows


# What the job page shows of each role's processes: the latest value of these metrics (the PS
# runtime's telemetry, workers/ps/stats.py and sdk.ps), by field name.
PS_METRICS = {
    "rows": "ps_rows",
    "bytes_held": "ps_bytes_held",
    "memory_bytes": "ps_memory_bytes",
    "pulls_per_s": "ps_pulls_per_s",
    "pushes_per_s": "ps_pushes_per_s",
    "pull_p50_ms": "ps_pull_p50_ms",
    "pull_p99_ms": "ps_pull_p99_ms",
    "push_p50_ms": "ps_push_p50_ms",
    "push_p99_ms": "ps_push_p99_ms",
}
WORKER_METRICS = {
    "examples_per_s": "worker_examples_per_s",
    "examples": "worker_examples",
    "staleness_mean": "worker_staleness_mean",
    "staleness_max": "worker_staleness_max",
}
QUEUE_METRICS = {
    "epoch": "queue_epoch",
    "epochs": "queue_epochs",
    "shards_per_epoch": "queue_shards_per_epoch",
    "done": "queue_done",
    "in_progress": "queue_in_progress",
    "todo": "queue_todo",
    "examples_done": "queue_examples_done",
    "requeued": "queue_requeued",
}
ROLE_METRICS = {"ps": PS_METRICS, "worker": WORKER_METRICS, "coordinator": QUEUE_METRICS}


def latest_values(job_id: int, round_number: int, pairs: list[tuple[int, str]]) -> dict[tuple[int, str], Any]:
    """The newest point of each (rank, metric name) in ``pairs`` for the round: {(rank, name):
    (value, time)}. Newest is the highest seq: a rank is one process in a round and its telemetry
    numbers its metric records in order (the step may repeat: an idle queue's examples done).
    Each pair is a short backward walk of the (job, round, rank, seq, name) unique index, however
    long the job has run and whatever the other ranks reported since.
    """
    if not pairs:
        return {}
    sql = """
        SELECT p.rank, p.name, m.value, m.time
        FROM unnest(%(ranks)s::integer[], %(names)s::text[]) AS p(rank, name)
        CROSS JOIN LATERAL (
            SELECT value, time FROM telemetry_metric
            WHERE job_id = %(job)s AND name = p.name AND round_number = %(round)s AND rank = p.rank
            ORDER BY seq DESC
            LIMIT 1
        ) m
    """
    with connection.cursor() as cur:
        cur.execute(
            sql,
            {
                "job": job_id,
                "round": round_number,
                "ranks": [rank for rank, _ in pairs],
                "names": [name for _, name in pairs],
            },
        )
        return {(rank, name): (value, at) for rank, name, value, at in cur.fetchall()}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def role_stats(job: Job, rnd: Round | None) -> dict[str, Any]:
    """Each PS's, each worker's and the shard queue's latest statistics in round ``rnd``, with
    where each process runs and whether it still does (``running``). A process that has not
    reported yet has its fields null."""
    processes: list[dict[str, Any]] = []
    if rnd is not None:
        for alloc in sorted(rnd.allocations.all(), key=lambda a: a.node_rank):
            ended = {e.get("local_rank") for e in alloc.exit_info.get("exits", [])}
            live = alloc.is_live and not rnd.ended
            for local_rank, process in enumerate(alloc.processes):
                running = live and not process.get("removed") and local_rank not in ended
                processes.append({**process, "node": alloc.node.name, "running": running})
    pairs = [(int(p["rank"]), name) for p in processes for name in ROLE_METRICS[p["role"]].values()]
    latest = latest_values(job.pk, rnd.number, pairs) if rnd is not None else {}

    def row(process: dict[str, Any]) -> dict[str, Any]:
        fields = ROLE_METRICS[process["role"]]
        found = {field: latest.get((int(process["rank"]), name)) for field, name in fields.items()}
        times = [point[1] for point in found.values() if point is not None]
        return {
            "index": process["index"],
            "rank": process["rank"],
            "node": process["node"],
            "running": process["running"],
            **{field: _finite(point[0]) if point else None for field, point in found.items()},
            "at": max(times).isoformat() if times else None,
        }

    by_role: dict[str, list[dict[str, Any]]] = {"ps": [], "worker": [], "coordinator": []}
    for process in sorted(processes, key=lambda p: (p["role"], p["index"])):
        by_role[process["role"]].append(row(process))
    return {
        "job": job.pk,
        "round": rnd.number if rnd is not None else None,
        "mode": job.roles.get("ps", {}).get("mode", ""),
        "ps": by_role["ps"],
        "workers": by_role["worker"],
        "queue": by_role["coordinator"][0] if by_role["coordinator"] else None,
    }
