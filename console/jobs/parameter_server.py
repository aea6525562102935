"""What a parameter-server worker's exit means for its job.

A worker's data shards are leased from the job's coordinator (workers/ps/coordinator.py): when a
worker dies its lease runs out and another worker does the shard again, and the PS apply each
batch's gradient once (pushes carry their (epoch, shard, batch) key). So a worker that ends, by
success or failure, changes no round: the agent keeps the PS and the other workers running
(workers/agent/launcher.py's ``survivable``) and the controller only counts. The job succeeds
once every worker of the round has ended and at least one finished its work; the PS and the
coordinator, which serve until told to stop, are then stopped (they write a final checkpoint).
A PS or coordinator that fails is a rank failure like any other: the round restarts and the PS
resume from their checkpoints.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from console.core.states import JobState
from console.jobs.failures import describe, failed, record_failure
from console.jobs.models import Allocation, Job, Round
from console.jobs.rounds import finish_job
from console.telemetry import events
from console.telemetry.models import Severity
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
            if process["role"] != "worker":
                continue
            workers += 1
            exit = exits.get(local_rank)
            if exit is not None:
                ended += 1
                succeeded += not failed(exit)
    return workers, ended, succeeded


def worker_exited(job: Job, alloc: Allocation, exit: protocol.RankExit, now: datetime) -> None:
    """A worker of ``job``'s current round ended (its exit is recorded on ``alloc`` already)."""
    process = process_of(alloc, exit)
    assert process is not None
    if failed(exit):
        cause = {"exit_code": exit.get("exit_code"), "signal": exit.get("signal")}
        events.emit(
            "ps.worker_lost",
            f"Worker {process['index']} on {alloc.node.name} ended with {describe(cause)}; its shard "
            "goes back to the queue, the PS and the other workers carry on",
            job=job,
            node=alloc.node,
            severity=Severity.WARNING,
            worker=process["index"],
            exit_code=exit.get("exit_code"),
            signal=exit.get("signal"),
        )
    workers, ended, succeeded = worker_tally(alloc.round)
    if ended < workers:
        return
    if succeeded:
        finish_job(
            job,
            JobState.SUCCEEDED,
            f"Succeeded in round {alloc.round.number}: {succeeded} of {workers} worker(s) finished",
        )
    else:
        record_failure(job, alloc, exit, now)  # every worker failed: the round failed
