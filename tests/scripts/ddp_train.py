"""A small torchrun-compatible DDP training script for tests and benchmarks.

Plain torch, no Trainyard SDK: it must run unchanged under bare ``torchrun`` and under the
agent. It trains a small MLP on synthetic data with gloo, resumes from the latest checkpoint,
checkpoints atomically on rank 0, and logs one JSON line per step (rank 0) to ``--progress``.

    torchrun --standalone --nproc-per-node 2 tests/scripts/ddp_train.py --steps 50 \
        --progress /tmp/progress.jsonl --checkpoint-dir /tmp/ckpt

SIGTERM makes every rank stop between steps (agreed through a one-element all-reduce, so no
rank is left waiting in a collective), rank 0 saves a checkpoint and all exit 0.
``--fail-at-step X --fail-rank R`` makes rank R raise at step X on the first attempt only
(TORCHELASTIC_RESTART_COUNT == "0"). ``--abort-in-teardown`` makes every rank SIGABRT itself in
the interpreter's teardown, after main has returned: what torch 2.13's gloo does now and then
(workers/agent/runner.py), made certain.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_NAME = "checkpoint.pt"
BATCH_SIZE = 32
FEATURES = 32
HIDDEN = 64
PRINT_EVERY = 10

_stop_requested = False


def _request_stop(signum: int, frame: FrameType | None) -> None:
    global _stop_requested
    _stop_requested = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--progress", default="")
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--abort-in-teardown", action="store_true")
    return parser.parse_args(argv)


class AbortInTeardown:
    """Kept in sys.modules, it is dropped when the interpreter clears the modules, after the
    atexit handlers; no core file is written."""

    def __init__(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def __del__(self, kill: Any = os.kill, pid: int = os.getpid(), abort: int = signal.SIGABRT) -> None:
        kill(pid, abort)


def checkpoint_dir(args: argparse.Namespace) -> Path | None:
    path = os.environ.get("TRAINYARD_CHECKPOINT_DIR") or args.checkpoint_dir
    return Path(path) if path else None


def save_checkpoint(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    with tmp.open("wb") as fh:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    # The rename is only durable once the directory entry is flushed too.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(directory: Path | None) -> dict[str, Any] | None:
    if directory is None or not (directory / CHECKPOINT_NAME).exists():
        return None
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    return state


class Progress:
    def __init__(self, path: str, enabled: bool) -> None:
        self.path = Path(path) if path and enabled else None

    def write(self, record_: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(record_) + "\n")


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _request_stop)
    if args.abort_in_teardown:
        sys.modules["_abort_in_teardown"] = AbortInTeardown()  # type: ignore[assignment]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    round_ = int(os.environ.get("TRAINYARD_ROUND") or restart_count)
    progress = Progress(args.progress, enabled=rank == 0)
    ckpt_dir = checkpoint_dir(args)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    state = load_checkpoint(ckpt_dir)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    ddp = DistributedDataParallel(model)
    progress.write({"event": "start", "t": time.time(), "resume_step": step, "world": world})

    generator = torch.Generator().manual_seed(1000 + rank)
    loss_fn = nn.MSELoss()
    stop_flag = torch.zeros(1)
    while step < args.steps:
        stop_flag.fill_(1.0 if _stop_requested else 0.0)
        dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        if stop_flag.item() > 0:
            if rank == 0 and ckpt_dir is not None:
                save_checkpoint(ckpt_dir, model, optimizer, step)
            print(f"rank {rank}: stopping at step {step} on SIGTERM", flush=True)
            dist.destroy_process_group()
            return 0
        step += 1
        if step == args.fail_at_step and rank == args.fail_rank and restart_count == 0:
            raise RuntimeError(f"injected failure at step {step} on rank {rank}")
        inputs = torch.randn(BATCH_SIZE, FEATURES, generator=generator)
        targets = inputs.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = loss_fn(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        progress.write(
            {"t": time.time(), "step": step, "world": world, "round": round_, "restart_count": restart_count}
        )
        if step % PRINT_EVERY == 0:
            print(f"rank {rank}: step {step} loss {loss.item():.4f}", flush=True)
        if (
            rank == 0
            and ckpt_dir is not None
            and args.checkpoint_every > 0
            and step % args.checkpoint_every == 0
        ):
            save_checkpoint(ckpt_dir, model, optimizer, step)
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

    if rank == 0 and ckpt_dir is not None:
        save_checkpoint(ckpt_dir, model, optimizer, step)
    print(f"rank {rank}: finished {step} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
