"""The hang bench's training script: a small gloo DDP model, plain or with the SDK's step
(``--sdk``), one JSON line per step from rank 0 to ``--progress``. ``--hang-at-step N --hang-rank R``
makes rank R stop before step N in a sleep that never ends (a data loader that never returns, say):
its peers then wait for it in the step's all-reduce."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--progress", default="")
    parser.add_argument("--sdk", action="store_true")
    parser.add_argument("--hang-at-step", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    step_of = contextlib.nullcontext
    if args.sdk:
        from workers import sdk

        step_of = sdk.step  # type: ignore[assignment]
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    progress = Path(args.progress) if args.progress and rank == 0 else None
    for step in range(1, args.steps + 1):
        if step == args.hang_at_step and rank == args.hang_rank:
            print(f"rank {rank}: hanging before step {step}", flush=True)
            time.sleep(3600)
        with step_of(step):  # type: ignore[operator]
            inputs = torch.randn(32, 32)
            loss = nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if progress is not None:
            with progress.open("a") as fh:
                fh.write(json.dumps({"t": time.time(), "step": step, "pid": os.getpid()}) + "\n")
        time.sleep(args.step_sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
