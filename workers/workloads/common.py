"""The training loop every built-in workload shares.

A workload is a ``Task``: a model, its optimizers, a deterministic batch for (step, micro-batch,
rank), a loss and an evaluation. This module owns everything else: the process group (torchrun's
environment contract), DDP, precision, gradient accumulation with ``no_sync``, clipping, the SDK
(statistics, logging, checkpoints, SIGTERM) and resuming from the latest checkpoint.

Batches depend only on (seed, step, micro-batch, rank), so a resumed run sees exactly the data
it would have seen without the interruption.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers import protocol, sdk
from workers.workloads.catalog import PRECISIONS


class WorkloadError(Exception):
    """A configuration the workload refuses to run (the message says why)."""


@dataclass
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    distributed: bool
    precision: str
    grad_accum_steps: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        if self.precision == "fp16":
            return torch.autocast(self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()


def start_runtime(precision: str | None, grad_accum_steps: int | None) -> Runtime:
    precision = (precision or os.environ.get(protocol.ENV_PRECISION) or "fp32").lower()
    if precision not in PRECISIONS:
        raise WorkloadError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    accum_text = os.environ.get(protocol.ENV_GRAD_ACCUM) or "1"
    try:
        accum = grad_accum_steps if grad_accum_steps is not None else int(accum_text)
    except ValueError:
        raise WorkloadError(f"{protocol.ENV_GRAD_ACCUM} must be an integer, got {accum_text!r}") from None
    if accum < 1:
        raise WorkloadError(f"grad_accum_steps must be at least 1, got {accum}")
    use_cuda = torch.cuda.is_available()
    if precision == "fp16" and not use_cuda:
        raise WorkloadError(
            "precision fp16 needs a GPU (GradScaler and fp16 kernels are CUDA-only); "
            "use bf16 or fp32 on CPU hosts"
        )
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    distributed = world_size > 1
    if distributed and not dist.is_initialized() and not elastic_mode():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Runtime(rank, local_rank, world_size, device, distributed, precision, accum)


def elastic_mode() -> bool:
    """Launched by an agent with a control file: the group is formed (and re-formed in place on
    membership changes) by sdk.elastic rather than once from torchrun's environment."""
    return (
        bool(os.environ.get(protocol.ENV_CONTROL))
        and os.environ.get(protocol.ENV_STRATEGY) != "parameter_server"
    )


class Task(ABC):
    """One workload: what to train and how to measure it."""

    name: str
    model: nn.Module

    @abstractmethod
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Stepped in order; the last one carries the watcher's update-ratio hook."""

    @abstractmethod
    def batch(self, step: int, micro: int) -> Any: ...

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor: ...

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics on rank 0 (model in eval mode, no grad)."""

    def samples(self, batch: Any) -> int:
        return len(batch[0])

    def tokens(self, batch: Any) -> int:
        return 0

    def clip_parameters(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]


def seeded(seed: int, *parts: int) -> torch.Generator:
    value = seed
    for part in parts:
        value = (value * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


@dataclass
class Outcome:
    first_step: int
    last_step: int
    stopped: bool


def train(task: Task, hp: dict[str, Any], runtime: Runtime) -> Outcome:
    """Trains ``task``; under an agent through sdk.elastic, so a resize keeps this process."""
    model = task.model.to(runtime.device)
    optimizers = task.optimizers()
    if not elastic_mode():
        return _train(task, hp, runtime, model, optimizers, None)
    device = runtime.device if runtime.device.type == "cuda" else None
    with sdk.elastic(model, optimizers, device=device) as run:
        return _train(task, hp, runtime, model, optimizers, run)


def _train(
    task: Task,
    hp: dict[str, Any],
    runtime: Runtime,
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    run: sdk.ElasticRun | None,
) -> Outcome:
    wrapped: nn.Module = model
    ddp: DistributedDataParallel | None = None
    if run is not None:
        _follow(runtime, run)
    elif runtime.distributed:
        ddp = DistributedDataParallel(
            model, device_ids=[runtime.local_rank] if runtime.device.type == "cuda" else None
        )
        wrapped = ddp
    scaler = torch.amp.GradScaler("cuda") if runtime.precision == "fp16" else None
    watcher = sdk.watch(model, every=hp["watch_every"], optimizer=optimizers[-1])
    timer = sdk.StepTimer(every=hp["log_every"])
    sdk.install_stop_handler()
    sdk.progress(hp["steps"])

    start = 0
    # A process that joined a running job in place got the state from a survivor already.
    resumed = (
        None
        if run is not None and run.joined
        else sdk.load_latest(map_location=runtime.device, collective=True)
    )
    if run is not None and run.joined:
        start = run.step
        if runtime.is_main:
            print(f"joined in place at step {start} (world size {runtime.world_size})", flush=True)
    if resumed is not None:
        state, start = resumed
        if state.get("workload", task.name) != task.name:
            raise WorkloadError(
                f"the checkpoint directory holds a {state['workload']!r} checkpoint (step {start}), "
                f"not {task.name!r}: give this job its own TRAINYARD_CHECKPOINT_DIR"
            )
        try:
            model.load_state_dict(state["model"])
            for optimizer, saved in zip(optimizers, state["optimizers"], strict=True):
                optimizer.load_state_dict(saved)
        except (RuntimeError, ValueError, KeyError) as error:
            raise WorkloadError(
                f"the checkpoint of step {start} does not fit this model (were shape "
                f"hyperparameters changed since it was written?): {error}"
            ) from None
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if runtime.is_main:
            print(f"resumed from the checkpoint of step {start}", flush=True)

    def checkpoint_state(step: int) -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizers": [o.state_dict() for o in optimizers],
            "scaler": scaler.state_dict() if scaler is not None else {},
            "step": step,
            "workload": task.name,
            "hyperparameters": hp,
        }

    accum = runtime.grad_accum_steps
    window_loss = torch.zeros((), device=runtime.device)
    window_steps = 0
    step = start
    stopped = False
    if run is not None:
        run.step = start
    steps = run.steps(hp["steps"]) if run is not None else range(start + 1, hp["steps"] + 1)
    for step in steps:
        if run is not None:
            _follow(runtime, run)
            wrapped = run.model
            ddp = wrapped if isinstance(wrapped, DistributedDataParallel) else None
            watcher.active = runtime.is_main
        model.train()
        samples = tokens = 0
        with timer(step):
            for micro in range(accum):
                batch = task.batch(step, micro)
                samples += task.samples(batch)
                tokens += task.tokens(batch)
                # All-reduce only on the last micro-batch: the earlier ones just accumulate.
                sync = ddp.no_sync() if ddp is not None and micro < accum - 1 else _nothing()
                with sync:
                    with runtime.autocast():
                        loss = task.loss(wrapped, batch) / accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                window_loss += loss.detach().float()
            if scaler is not None:
                for optimizer in optimizers:
                    scaler.unscale_(optimizer)
            watcher.after_backward(step)
            if hp["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(task.clip_parameters(), hp["grad_clip"])
            for optimizer in optimizers:
                if scaler is not None:
                    scaler.step(optimizer)
                else:
                    optimizer.step()
            if scaler is not None:
                scaler.update()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            timer.count(samples * runtime.world_size, tokens * runtime.world_size)
        window_steps += 1

        # Every rank of the group must take the same logging steps (an all-reduce): a process
        # that joined in place does not log its own first step.
        first = step == start + 1 and (run is None or not run.joined)
        if step % hp["log_every"] == 0 or first or step == hp["steps"]:
            mean_loss = window_loss / window_steps
            if runtime.distributed:
                dist.all_reduce(mean_loss)
                mean_loss /= runtime.world_size
            if runtime.is_main:
                values = {"loss": float(mean_loss), "lr": float(optimizers[-1].param_groups[0]["lr"])}
                values.update(task.evaluate())
                sdk.log(step, **values)
            window_loss.zero_()
            window_steps = 0

        # In place, the step boundary agrees on stopping (sdk.elastic: SIGTERM on every rank).
        if run is None and sdk.should_stop(step):
            stopped = True
            break
        if hp["checkpoint_every"] and step % hp["checkpoint_every"] == 0 and step != hp["steps"]:
            sdk.save_async(checkpoint_state(step), step)

    if run is not None:
        stopped = run.stopped
        if run.left:  # this node left the job in place: the others carry on without it
            sdk.wait()
            sdk.flush()
            print(f"left the job at step {run.step}", flush=True)
            return Outcome(start + 1, run.step, True)
    # The final (or on-SIGTERM) checkpoint is written synchronously: the process is about to exit.
    sdk.wait()
    if step > start:
        sdk.save(checkpoint_state(step), step)
    sdk.flush()
    if runtime.is_main:
        verb = "stopped" if stopped else "finished"
        print(f"{verb} at step {step}", flush=True)
    return Outcome(start + 1, step, stopped)


def _follow(runtime: Runtime, run: sdk.ElasticRun) -> None:
    """The runtime's place in the group, as of the current round (it changes in place)."""
    runtime.rank, runtime.world_size = run.rank, run.world_size
    runtime.distributed = run.world_size > 1


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def load_hyperparameters(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from workers.workloads.catalog import validate_hyperparameters

    text = os.environ.get(protocol.ENV_HYPERPARAMETERS) or "{}"
    try:
        from_env = json.loads(text)
    except json.JSONDecodeError as error:
        raise WorkloadError(f"{protocol.ENV_HYPERPARAMETERS} is not valid JSON: {error}") from None
    if not isinstance(from_env, dict):
        raise WorkloadError(f"{protocol.ENV_HYPERPARAMETERS} must be a JSON object")
    try:
        return validate_hyperparameters(name, {**from_env, **overrides})
    except ValueError as error:
        raise WorkloadError(str(error)) from None


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
