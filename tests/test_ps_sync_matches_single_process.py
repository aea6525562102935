"""Synchronous PS training (2 workers, 2 PS, real processes) equals single-process training.

Same seed, same batches per step (whichever worker held them), fp32: the PS applies one update
per step from the examples-weighted mean of its members' gradients, which is the gradient of the
mean loss over the step's union batch; rows use SparseAdam's formulas, dense parameters torch's Adam.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from workers.ps.contract import Mode
from workers.ps.local import LocalPsJob
from workers.ps.placement import initial_rows
from workers.workloads.catalog import validate_hyperparameters
from workers.workloads.recsys import DLRM, EMBEDDING_STD, TABLES, ClickLog

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ps_recsys_sync.py")
SEED = 3
HP: dict[str, Any] = {
    "rows": 400,
    "small_rows": 20,
    "dim": 8,
    "batch_size": 32,
    "shard_batches": 1,
    "examples": 32 * 16,
    "grad_clip": 0.0,
    "eval_samples": 64,
    "log_every": 1000,
    "seed": SEED,
    # Adam divides by the gradient's running scale, so fp32 summation-order differences (the PS
    # sums the workers' means, one process sums the union) grow with the step size: 0.05 gave
    # 1.3e-5 on the small, busy category table after 16 steps, 0.01 keeps it well under 1e-5.
    "embedding_lr": 0.01,
    "lr": 0.01,
}


def reference(hp: dict[str, Any], steps: list[list[tuple[int, int]]]) -> DLRM:
    """Single-process training on the same batches, one optimizer step per PS step."""
    rows = {"users": hp["rows"], "items": hp["rows"], "categories": hp["small_rows"]}
    bags = {
        name: nn.EmbeddingBag(int(count), int(hp["dim"]), mode="mean", sparse=True)
        for name, count in rows.items()
    }  # type: ignore[call-overload]
    torch.manual_seed(SEED)  # as the PS worker: tables first (no draws), then the dense layers
    model = DLRM(hp, sparse=True, tables=dict(bags))
    with torch.no_grad():
        for name, bag in bags.items():
            bag.weight.copy_(
                initial_rows(SEED, name, torch.arange(rows[name]), int(hp["dim"]), EMBEDDING_STD)
            )  # type: ignore[call-overload]
    tables = torch.optim.SparseAdam([bag.weight for bag in bags.values()], lr=float(hp["embedding_lr"]))  # type: ignore[arg-type]
    dense = torch.optim.Adam(model.dense_part().parameters(), lr=float(hp["lr"]))  # type: ignore[arg-type]
    log = ClickLog(hp)
    for batches in steps:
        parts = [log.examples(start, end, SEED) for start, end in batches]
        *features, clicks = (torch.cat(columns) for columns in zip(*parts, strict=True))
        loss = F.binary_cross_entropy_with_logits(model(*features), clicks)
        loss.backward()
        tables.step()
        dense.step()
        tables.zero_grad()
        dense.zero_grad()
    return model


def test_synchronous_ps_training_matches_single_process(
    ps_job: Callable[..., LocalPsJob], tmp_path: Path
) -> None:
    started = time.monotonic()
    hp = validate_hyperparameters("recsys-embedding", HP)
    job: LocalPsJob = ps_job(ps_count=2, mode=Mode.SYNC, seed=SEED, worker_count=2)
    job.start_servers()
    # Given two synchronous workers over two PS
    workers = [
        job.start_worker(i, [SCRIPT, str(tmp_path / f"record-{i}.json"), json.dumps(HP)], worker_count=2)
        for i in range(2)
    ]
    for i, worker in enumerate(workers):
        assert worker.wait(300) == 0, job.log(f"worker-{i}")
    by_step: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i in range(2):
        for step, start, end in json.loads((tmp_path / f"record-{i}.json").read_text()):
            by_step[step].append((start, end))
    steps = [sorted(by_step[step]) for step in sorted(by_step)]
    assert sum(len(s) for s in steps) == 16 and any(len(s) == 2 for s in steps), steps
    # when the same batches train one process, step by step
    model = reference(hp, steps)
    # then tables and dense layers agree within fp32 rounding
    client = job.client()
    dense_names = [f"dense/{name}" for name, _ in model.dense_part().named_parameters()]
    ids = {"users": torch.arange(400), "items": torch.arange(400), "categories": torch.arange(20)}
    rows, dense, _ = client.pull(ids, dense_names)
    for name in TABLES:
        expected = getattr(model, name).weight.detach()
        assert torch.allclose(rows[name], expected, atol=1e-5, rtol=0), (
            name,
            (rows[name] - expected).abs().max(),
        )
    for name, param in model.dense_part().named_parameters():
        got = dense[f"dense/{name}"]
        assert torch.allclose(got, param.detach(), atol=1e-5, rtol=0), (name, (got - param).abs().max())
    moved = (rows["users"] - initial_rows(SEED, "users", torch.arange(400), 8, EMBEDDING_STD)).abs().max()
    assert moved > 1e-2  # training did move the rows
    worst = max(
        *[float((rows[name] - getattr(model, name).weight.detach()).abs().max()) for name in TABLES],
        *[
            float((dense[f"dense/{n}"] - p.detach()).abs().max())
            for n, p in model.dense_part().named_parameters()
        ],
    )
    print(
        f"\n{len(steps)} synchronous steps over 16 batches matched (largest difference {worst:.1e}); "
        f"{time.monotonic() - started:.1f} s"
    )
