"""A small DDP training script that uses the Trainyard SDK: the folder the browser tests upload.

It announces its total (sdk.progress), reports loss and learning rate (sdk.log), step time,
throughput and memory (sdk.step), gradient and parameter norms (sdk.watch), checkpoints every
10 steps (sdk.save) and resumes from the latest one; SIGTERM stops it at a step boundary.

    torchrun --standalone --nproc-per-node 2 train.py --steps 200 --sleep 0.1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers import sdk

BATCH = 32
FEATURES = 16
LR = 0.02


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sdk.progress(args.steps)
    watcher = sdk.watch(model, every=5, optimizer=optimizer)
    sdk.install_stop_handler()
    start = 0
    resumed = sdk.load_latest(collective=True)
    if resumed is not None:
        state, start = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        print(f"rank {rank}: resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, args.steps + 1):
        with sdk.step(step, samples=BATCH * dist.get_world_size()):
            inputs = torch.randn(BATCH, FEATURES, generator=generator)
            loss = ((ddp(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
            loss.backward()
            watcher.after_backward(step)
            optimizer.step()
            optimizer.zero_grad()
        if rank == 0:
            sdk.log(step, loss=loss, lr=LR)
        print(f"rank {rank}: step {step} loss {loss.item():.4f}", flush=True)
        stop = sdk.should_stop(step)
        if stop or step % 10 == 0:
            sdk.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
        if stop:
            print(f"rank {rank}: stopping at step {step}", flush=True)
            break
        time.sleep(args.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
