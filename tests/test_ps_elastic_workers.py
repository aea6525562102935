"""Asynchronous PS training while workers come and go: 2 -> 4 -> 1 mid-epoch, one SIGKILLed.

No PS restarts, every example is processed exactly once (the coordinator's count) and every
batch's gradient is applied exactly once: the count worker's parameters count applications
(each row ends at -1, the counter at minus the number of batches). Hold files pace the workers,
so the resize lands mid-epoch however slow the machine is.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tests.support.ps import count_worker_argv, wait_for
from workers.ps.local import LocalPsJob

EXAMPLES = 3200
SHARD = 160  # 10 batches: a worker leaving mid-shard is the common case
BATCH = 16


def test_workers_resized_and_killed_mid_epoch_without_ps_restart(
    ps_job: Callable[..., LocalPsJob], tmp_path: Path
) -> None:
    started = time.monotonic()
    job: LocalPsJob = ps_job(ps_count=2, lease_s=2.0)
    job.start_servers()
    ps_pids = [job.processes[f"ps-{i}"].pid for i in range(2)]
    queue = job.coordinator_client()
    holds = [tmp_path / f"hold-{i}" for i in range(4)]

    def worker(index: int) -> None:
        argv = count_worker_argv(
            tmp_path / f"w{index}.json",
            EXAMPLES,
            SHARD,
            BATCH,
            "--sleep",
            "0.02",
            "--hold",
            str(holds[index]),
        )
        job.start_worker(index, argv)

    # Given two workers training asynchronously
    for index in (0, 1):
        worker(index)
    wait_for(lambda: queue.queue()["epochs"] and queue.queue()["done"] >= 2, 120, "2 shards done", job)
    holds[0].touch()
    holds[1].touch()
    # when two more join mid-epoch (the first two paused) and push
    spawned_at = time.time()
    for index in (2, 3):
        worker(index)
    markers = [tmp_path / f"w{i}.json.first" for i in (2, 3)]
    wait_for(lambda: all(marker.exists() for marker in markers), 120, "the new workers' first pushes", job)
    joins = [json.loads((tmp_path / f"w{i}.json.first").read_text()) for i in (2, 3)]
    # and then one is SIGKILLed and two leave (SIGTERM: after their current batch), leaving one
    job.kill("worker-1", signal.SIGKILL)
    job.kill("worker-2", signal.SIGTERM)
    job.kill("worker-3", signal.SIGTERM)
    for index in (2, 3):
        assert job.processes[f"worker-{index}"].wait(60) == 0, job.log(f"worker-{index}")
    assert queue.queue()["done"] < EXAMPLES // SHARD, "the resize came too late: the epoch was over"
    holds[0].unlink()
    assert job.processes["worker-0"].wait(180) == 0, job.log("worker-0")

    # then the PS never restarted
    assert all(job.processes[f"ps-{i}"].poll() is None for i in range(2))
    assert [job.processes[f"ps-{i}"].pid for i in range(2)] == ps_pids
    # every example was processed exactly once, by the coordinator's count
    stats = queue.queue()
    assert stats["finished"] and stats["examples_done"] == EXAMPLES
    assert stats["completions"] == {f"0:{shard}": 1 for shard in range(EXAMPLES // SHARD)}
    assert stats["requeued"] >= 1  # shards of the departed workers went back to the queue
    # and every batch's gradient was applied exactly once, by the parameters themselves
    client = job.client()
    rows, dense, _ = client.pull({"examples": torch.arange(EXAMPLES)}, ["dense/weight"])
    assert torch.equal(rows["examples"], torch.full((EXAMPLES, 1), -1.0))
    assert float(dense["dense/weight"]) == -(EXAMPLES // BATCH)
    ps_stats = client.stats()
    # Each batch touches both PS (rows i mod 2) and one holds the counter.
    assert sorted(s["applied_batches"] for s in ps_stats) == [EXAMPLES // BATCH] * 2
    join_s = max(j["first_push_at"] for j in joins) - spawned_at
    import_s = max(j["started_at"] for j in joins) - spawned_at
    print(
        f"\nworkers 2 -> 4 -> 1: new workers pushed {join_s:.1f} s after their spawn ({import_s:.1f} s of it "
        f"interpreter start and imports); "
        f"{stats['requeued']} shards re-queued; {sum(s['duplicates'] for s in ps_stats)} duplicate pushes "
        f"dropped; {time.monotonic() - started:.1f} s in all"
    )
