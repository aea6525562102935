"""A plain torchrun-style DDP script that writes TensorBoard scalars, with no Trainyard SDK: what
many training scripts already do. Rank 0 writes ``SummaryWriter()``'s default ``runs/`` directory
(under the working directory) every step: ``loss`` and ``add_scalars("lr", {"base": ...})``.

    torchrun --standalone --nproc-per-node 2 tests/scripts/tb_ddp.py --steps 40
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter() if rank == 0 else None
    inputs = torch.randn(64, 8)
    targets = inputs.sum(dim=1, keepdim=True)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
            writer.add_scalars("lr", {"base": 0.05}, step)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_sleep)
    if writer is not None:
        writer.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"done on rank {rank} pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
