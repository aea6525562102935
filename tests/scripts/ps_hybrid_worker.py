"""A hybrid-mode PS worker: a small embedding on the PS and a dense layer all-reduced by DDP over
the dense group the console gives it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Usage: ps_hybrid_worker.py PREFIX --examples N --shard-size S --batch-size B [--sleep SECONDS]
("{index}" in PREFIX: the worker's index). Its dense layer starts from a seed of its own index, so
weights that came from the PS are told from a fresh init. It writes PREFIX.loaded.json (the dense
weights after ``dense()`` loaded them), PREFIX.first (pid, after its first push) and, on the
dense group's rank 0, one line of PREFIX.saved.jsonl per save of the dense weights to the PS
(``ps._dense_saved_at`` moved, and the save on close).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable
from torch.nn.parallel import DistributedDataParallel

from workers import sdk


def weights(module: nn.Module) -> list[list[float]]:
    return [p.detach().reshape(-1).tolist() for p in module.parameters()]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("--examples", type=int, required=True)
    parser.add_argument("--shard-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    index = int(os.environ.get("TRAINYARD_PS_INDEX", "0"))
    prefix = args.prefix.replace("{index}", str(index))
    sdk.install_stop_handler()  # SIGTERM: stop after this batch (passes() tells the whole group)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=20))

    ps = sdk.ps.connect()
    rows = ps.embedding_bag("items", dim=1, optimizer=sdk.ps.SGD(lr=0.1), init_std=0.0, mode="sum")
    torch.manual_seed(100 + index)
    dense = nn.Linear(4, 1)
    ps.dense(dense, sdk.ps.SGD(lr=0.05))
    with open(prefix + ".loaded.json", "w") as handle:
        json.dump(weights(dense), handle)
    model: nn.Module = DistributedDataParallel(dense) if world > 1 else dense
    saved_at = ps._dense_saved_at
    joinables: list[Joinable] = [model] if isinstance(model, DistributedDataParallel) else []
    dataset = sdk.ps.Dataset(args.examples, args.shard_size, args.batch_size, 1)
    for batches in ps.passes(dataset):  # one Join per pass: see sdk.ps.Session.passes
        with Join(joinables) if joinables else contextlib.nullcontext():
            for batch in batches:
                if sdk.stop_requested():
                    break
                with ps.step(batch):
                    ids = torch.arange(batch.start, batch.end)
                    x = torch.sin(ids[:, None].float() * torch.arange(1, 5).float())
                    y = torch.cos(ids.float())[:, None]
                    loss = (model(x) - y).pow(2).mean() + 0.01 * rows(ids[:, None]).sum()
                    loss.backward()
                if ps.pushes == 1:
                    with open(prefix + ".first", "w") as handle:
                        json.dump({"pid": os.getpid()}, handle)
                if ps._dense_saved_at != saved_at:
                    saved_at = ps._dense_saved_at
                    with open(prefix + ".saved.jsonl", "a") as handle:
                        handle.write(json.dumps(weights(dense)) + "\n")
                if args.sleep:
                    time.sleep(args.sleep)
    saves = ps.saves_dense
    ps.close()  # rank 0 saves its dense weights once more
    if saves:
        with open(prefix + ".saved.jsonl", "a") as handle:
            handle.write(json.dumps(weights(dense)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
