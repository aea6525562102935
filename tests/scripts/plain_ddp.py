"""A plain torchrun-style DDP training script: what a user brings, with no Trainyard SDK.

    torchrun --standalone --nproc-per-node 2 tests/scripts/plain_ddp.py --steps 200 \
        --step-log /tmp/steps.jsonl --checkpoint-dir /tmp/snapshots

It initialises the process group from torchrun's environment, trains a small MLP in
DistributedDataParallel on a synthetic data set read through a DataLoader with a
DistributedSampler, writes a ``torch.save`` snapshot every ``--checkpoint-every`` steps (rank 0,
atomically: temp file, fsync, rename) into ``TRAINYARD_CHECKPOINT_DIR`` (or ``--checkpoint-dir``)
and resumes from the latest snapshot with ``torch.load``, at the same sampler epoch and position.

Its own record, one JSON line per step appended to ``--step-log`` by rank 0 (by every rank when the
path holds ``{rank}``): step, loss, world size, round (``TRAINYARD_ROUND``, else
``TORCHELASTIC_RESTART_COUNT``), restart count, rank, pid and time; a ``start`` line per process
with the step it resumed from, the snapshot it read and when each phase of its start ended
(``phases``: main entered, process group formed, snapshot read, DDP wrapped). Each line is one ``write`` on an
``O_APPEND`` descriptor, so lines of two processes never mix. Every rank also prints
``step N loss X`` on stdout, which the console keeps as log lines.

``--sdk-metrics`` is the one concession to the console: the script then also hands each step's
loss to ``workers.sdk.log`` and flushes it to the agent's telemetry file *before* writing its own
line, so every step in the log has a metric point the console should store (bench/chaos compares
the two). Without it nothing from ``workers`` is imported.

SIGTERM stops every rank between steps (agreed through a one-element all-reduce, so no rank is
left alone in a collective); rank 0 writes a snapshot of the exact step and all exit 0.
``--finish-file`` lets a harness end an open-ended run (``--steps`` large) cleanly when it has
seen enough: rank 0 looks for the file before each step and the same all-reduce tells the others.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES = 16
HIDDEN = 32
SAMPLES = 2048
SNAPSHOT_PREFIX = "snapshot-"
SNAPSHOT_KEEP = 3
STOP, FINISH = 1.0, 2.0  # the agreed flag: a rank got SIGTERM / the harness asked the run to end

_stop_requested = False


def _request_stop(signum: int, frame: FrameType | None) -> None:
    global _stop_requested
    _stop_requested = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", default="", help="when TRAINYARD_CHECKPOINT_DIR is unset")
    parser.add_argument(
        "--step-log", default="", help="JSON lines, one per step; '{rank}' = one file per rank"
    )
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds after each step")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--sdk-metrics", action="store_true", help="also send the loss as SDK metrics")
    parser.add_argument(
        "--finish-file",
        default="",
        help="end the run as if --steps were reached at the first step after this file exists",
    )
    return parser.parse_args(argv)


# --- snapshots ---------------------------------------------------------------------------------


def snapshot_dir(args: argparse.Namespace) -> Path | None:
    path = os.environ.get("TRAINYARD_CHECKPOINT_DIR") or args.checkpoint_dir
    return Path(path) if path else None


def snapshot_path(directory: Path, step: int) -> Path:
    return directory / f"{SNAPSHOT_PREFIX}{step:09d}.pt"


def snapshots(directory: Path) -> list[Path]:
    """Finished snapshots, oldest first (temp files start with a dot and are not listed)."""
    return sorted(directory.glob(f"{SNAPSHOT_PREFIX}*.pt"))


def save_snapshot(directory: Path, state: dict[str, Any], step: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    final = snapshot_path(directory, step)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    with tmp.open("wb") as fh:
        torch.save({**state, "step": step}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    # The rename is durable only once the directory entry is flushed too.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in snapshots(directory)[:-SNAPSHOT_KEEP]:
        old.unlink(missing_ok=True)


def load_latest(directory: Path | None) -> tuple[dict[str, Any], str] | None:
    """The newest snapshot that loads, and its file name."""
    if directory is None or not directory.is_dir():
        return None
    for path in reversed(snapshots(directory)):
        try:
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as exc:
            # Deleted by a newer save meanwhile, or unreadable: try the one before.
            print(f"skipping snapshot {path.name}: {exc}", file=sys.stderr, flush=True)
            continue
        return state, path.name
    return None


# --- the step log ------------------------------------------------------------------------------


class StepLog:
    """Appends JSON lines with one write each on an O_APPEND descriptor."""

    def __init__(self, template: str, rank: int) -> None:
        self.fd: int | None = None
        if template and ("{rank}" in template or rank == 0):
            path = Path(template.replace("{rank}", str(rank)))
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def metric_sender(enabled: bool) -> Callable[[int, float], None]:
    """``sdk.log`` plus a flush, so the point is in the agent's file before the step is logged."""
    if not enabled:
        return lambda step, loss: None
    from workers import sdk

    def send(step: int, loss: float) -> None:
        sdk.log(step, loss=loss)
        sdk.flush()

    return send


# --- training ----------------------------------------------------------------------------------


def synthetic_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(inputs, targets)


def batches(
    loader: DataLoader[tuple[torch.Tensor, ...]], sampler: DistributedSampler[Any], start_step: int
) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """(epoch, batch) from the position ``start_step`` steps into the data, epoch after epoch.

    The position follows from the step and the current world size: after a resize the same step
    falls elsewhere in the data, as with any torchrun script that resumes this way.
    """
    per_epoch = len(loader)
    epoch, skip = divmod(start_step, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            if index >= skip:
                yield epoch, batch
        skip = 0
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    phases = {"main": time.time()}  # when each phase of the start ended (the start line has them)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _request_stop)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    phases["init_process_group"] = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    round_ = int(os.environ.get("TRAINYARD_ROUND") or restart_count)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else None
    log = StepLog(args.step_log, rank)
    send_metric = metric_sender(args.sdk_metrics)
    directory = snapshot_dir(args)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step, snapshot = 0, ""
    resumed = load_latest(directory)
    if resumed is not None:
        state, snapshot = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    phases["snapshot"] = time.time()
    if device is not None:
        model.to(device)
    ddp = DistributedDataParallel(model)
    phases["ddp"] = time.time()
    data = synthetic_data()
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    identity = {"rank": rank, "pid": os.getpid(), "round": round_, "restart_count": restart_count}
    # Every rank's resume step, so the log shows that all of them resumed from the same snapshot.
    resumed_at: list[Any] = [None] * world
    dist.all_gather_object(resumed_at, step)
    log.write(
        {
            "event": "start",
            "t": time.time(),
            "phases": phases,
            "resume_step": step,
            "snapshot": snapshot,
            "ranks_resume": resumed_at,
            "world": world,
            **identity,
        }
    )

    loss_fn = nn.MSELoss()
    stop_flag = torch.zeros(1, device=device)
    finish_file = Path(args.finish_file) if args.finish_file and rank == 0 else None
    data_iter = batches(loader, sampler, step)
    while step < args.steps:
        finishing = finish_file is not None and finish_file.exists()
        stop_flag.fill_(FINISH if finishing else STOP if _stop_requested else 0.0)
        dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        if stop_flag.item() == FINISH:
            break
        if stop_flag.item() == STOP:
            if rank == 0 and directory is not None:
                save_snapshot(
                    directory, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step
                )
            log.write({"event": "stop", "t": time.time(), "step": step, **identity})
            print(f"rank {rank}: stopping at step {step} on SIGTERM", flush=True)
            dist.destroy_process_group()
            return 0
        epoch, (inputs, targets) = next(data_iter)
        if device is not None:
            inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        loss = loss_fn(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        step += 1
        value = loss.item()
        send_metric(step, value)
        log.write({"t": time.time(), "step": step, "loss": value, "world": world, "epoch": epoch, **identity})
        print(f"step {step} loss {value:.6f}", flush=True)
        if (
            rank == 0
            and directory is not None
            and args.checkpoint_every > 0
            and step % args.checkpoint_every == 0
        ):
            save_snapshot(directory, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

    if rank == 0 and directory is not None:
        save_snapshot(directory, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
    log.write({"event": "end", "t": time.time(), "step": step, **identity})
    log.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
