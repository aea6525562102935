"""Trainyard training SDK: metrics, model statistics, checkpoints and graceful stop.

One import, and the script still runs unchanged under plain ``torchrun`` or ``python``::

    from workers import sdk

    sdk.progress(steps)                                          # the console's progress bar and ETA
    watcher = sdk.watch(model, every=100, optimizer=optimizer)  # grad/param norms, NaN/Inf events
    resumed = sdk.load_latest()                                  # (state, step) or None
    start = 0
    if resumed:
        state, start = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    for step in range(start + 1, steps + 1):
        with sdk.step(step, samples=batch_size, tokens=batch_size * seq_len):  # time, throughput, memory
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            watcher.after_backward(step)                       # before clipping
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        sdk.log(step, loss=loss, lr=scheduler.get_last_lr()[0])  # any scalars; tensors are fine
        stop = sdk.should_stop(step)                           # SIGTERM on any rank → True on all
        if stop or step % 500 == 0:
            sdk.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
        if stop:
            break

Inside the console (the agent sets ``TRAINYARD_TELEMETRY``) every call appends a record to that
file in the format of ``workers/protocol.py``; writes are buffered and flushed by a background
thread every 0.2 s and at exit, so a call costs a few microseconds and never waits on disk.
Outside the console rank 0 prints a compact line every ``TRAINYARD_PRINT_EVERY`` steps (default
10; 0 = silent) and the other ranks stay quiet. ``log`` records on whichever rank calls it:
log global values (an all-reduced loss) from rank 0 only.

Statistics: ``sdk.step`` reports step time, samples/s, tokens/s and peak memory (CUDA max
allocated, or peak RSS) every 10 steps; the watcher reports on rank 0, every ``every`` steps,
the global and per-layer gradient norms, the parameter norm, the update/parameter ratio (needs
``optimizer=``), and emits a ``gradient_anomaly`` event naming the layer and step when a
gradient is NaN/Inf. With fp16 call ``scaler.unscale_(optimizer)`` before ``after_backward``.

In-place elasticity: ``with sdk.elastic(model, optimizer) as run: for batch in
run.batches(dataset, batch_size): ...`` keeps the process across membership changes (see
``workers/sdk/elastic.py``).

Checkpoints go to ``TRAINYARD_CHECKPOINT_DIR`` (or ``directory=``), atomically (temp file,
fsync, rename), keeping the last ``keep`` (default 3, env ``TRAINYARD_CHECKPOINT_KEEP``), each
recorded in the console with its size and how long it blocked. In DDP only rank 0 writes and
the others wait on a barrier; ``load_latest(collective=True)`` makes every rank resume from
rank 0's checkpoint when hosts do not share the directory. ``save_async`` blocks only for a copy
into host memory and writes in a background thread (``sdk.wait()`` joins it; the next save
waits for the previous write). ``save_sharded``/``load_sharded`` use
torch.distributed.checkpoint, one shard per rank. ``should_stop(step)`` compares the ranks'
flags every 10 steps with a one-element all-reduce (without ``step``: on every call), so every
rank must call it with the same steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.sdk.checkpoint import (
    AsyncCheckpointer,
    CheckpointError,
    latest_step,
    load_latest,
    load_sharded,
    save,
    save_async,
    save_sharded,
    wait,
)
from workers.sdk.elastic import ElasticRun, elastic
from workers.sdk.elastic_control import ElasticError
from workers.sdk.monitor import StepTimer, Watcher, peak_memory_bytes
from workers.sdk.stop import install_stop_handler, request_stop, should_stop, stop_requested
from workers.sdk.telemetry import telemetry as _sink
from workers.sdk.trackers import mirror as _trackers

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "ElasticError",
    "ElasticRun",
    "StepTimer",
    "Watcher",
    "elastic",
    "event",
    "flush",
    "install_stop_handler",
    "latest_step",
    "load_latest",
    "load_sharded",
    "log",
    "peak_memory_bytes",
    "progress",
    "request_stop",
    "save",
    "save_async",
    "save_sharded",
    "should_stop",
    "step",
    "stop_requested",
    "wait",
    "watch",
]


def log(step: int, **scalars: Any) -> None:
    """Records scalars (numbers or one-element tensors) for ``step``; mirrored to TensorBoard
    and/or MLflow when the job asks (``TRAINYARD_TRACKERS``, workers/sdk/trackers.py)."""
    # The telemetry file first: its exit handler is then registered before the trackers', so the
    # trackers close (and record where they wrote) while the file still takes records.
    _sink().metric(step, scalars)
    _trackers().log(step, scalars)


TOTAL_STEPS = "total_steps"


def progress(total: int, step: int = 0) -> None:
    """Tells the console how many steps the run will take, for its progress bar and ETA.

    Recorded as the metric ``total_steps`` (call again if the total changes; the newest value
    counts). Outside the console it does nothing."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"progress(total) needs a positive whole number of steps, not {total!r}")
    _sink().metric(step, {TOTAL_STEPS: total}, echo=False)


def event(name: str, message: str, severity: str = "info", **data: Any) -> None:
    _sink().event(name, severity, message, data)


def flush() -> None:
    _sink().flush()


def watch(model: nn.Module, every: int = 100, optimizer: torch.optim.Optimizer | None = None) -> Watcher:
    return Watcher(model, every=every, optimizer=optimizer)


_timer = StepTimer()


def step(step: int, samples: int = 0, tokens: int = 0) -> StepTimer:
    """``with sdk.step(step, samples=n):`` times one step and reports throughput and memory."""
    return _timer(step, samples, tokens)


def __getattr__(name: str) -> Any:
    # ``sdk.ps`` brings in grpc: imported on first use, so scripts without a PS do not pay for it.
    if name == "ps":
        import importlib

        return importlib.import_module("workers.sdk.ps")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
