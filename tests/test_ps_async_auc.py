"""Asynchronous PS training of recsys-embedding reaches the AUC of the allreduce run.

Both on the planted-signal click log with the same hyperparameters and the same number of
examples (2 DDP ranks; 2 PS workers over 2 PS), evaluated on the same held-out set.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.ps import telemetry
from tests.test_workload_digits import RankGroup, workload
from workers.ps.local import LocalPsJob

SETTINGS = [
    "rows=2000",
    "steps=80",
    "batch_size=256",
    "eval_samples=8192",
    "log_every=1000",
    "checkpoint_every=0",
    "watch_every=1000",
]


def test_async_ps_reaches_the_allreduce_auc(ps_job: Callable[..., LocalPsJob], tmp_path: Path) -> None:
    started = time.monotonic()
    argv = workload("recsys-embedding", *SETTINGS)
    # Given the allreduce run and the asynchronous PS run of the same job, side by side
    job: LocalPsJob = ps_job(ps_count=2)
    with RankGroup(tmp_path / "allreduce", argv) as group:
        group.start()
        job.start_servers()
        workers = [
            job.start_worker(i, argv, worker_count=2, TRAINYARD_STRATEGY="parameter_server") for i in range(2)
        ]
        # when both finish
        assert group.wait(timeout=300) == [0, 0], group.text()
        for i, worker in enumerate(workers):
            assert worker.wait(300) == 0, job.log(f"worker-{i}")
    allreduce_auc = group.series("auc")[-1][1]
    ps_auc = [r["values"]["auc"] for r in telemetry(job, "worker", 0) if "auc" in r.get("values", {})][-1]
    examples = sum(
        [
            r["values"]["worker_examples"]
            for r in telemetry(job, "worker", i)
            if "worker_examples" in r.get("values", {})
        ][-1]
        for i in range(2)
    )
    # then the PS run saw the same examples and is within 0.01 AUC of (or above) the allreduce run
    assert examples == 80 * 256 * 2
    assert ps_auc >= allreduce_auc - 0.01, (ps_auc, allreduce_auc)
    assert allreduce_auc > 0.7  # both learned the planted signal
    print(
        f"\nAUC: asynchronous PS {ps_auc:.4f}, allreduce {allreduce_auc:.4f}; "
        f"{time.monotonic() - started:.1f} s; "
        + json.dumps(job.coordinator_client().queue()["examples_done"])
    )
