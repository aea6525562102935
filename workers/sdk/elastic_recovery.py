"""What lets an in-place rank (:mod:`workers.sdk.elastic`) outlive a peer that dies mid-step.

A collective that fails because a peer died (gloo raises on the closed connection; a peer that
vanished without closing it shows up when the group's ``collective_timeout`` expires) does not end
the survivors. DDP's gradient all-reduce goes through :meth:`StepGuard.allreduce`, which records
the failure instead of raising (the run's step-boundary all-reduce is guarded the same way). At
the boundary the run puts model and optimizer back to where they were before the step
(:meth:`StepGuard.undo`; the copy is taken at every step, so the step's partial gradient is
discarded), waits for a newer round and redoes the step over the new world.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def completed(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(tensor)
    return future


class StepGuard:
    """The copy of model and optimizer before the current step, and whether the step broke."""

    def __init__(self, module: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
        self.module = module
        self.optimizers = optimizers
        # A collective of the current step failed (a peer died): the error, until recovered.
        self.broken: str | None = None
        self._before_step: dict[str, Any] | None = None

    def keep(self) -> None:
        """Copies model and optimizer before the step, to put back if its collectives fail."""
        self._before_step = {
            "model": {key: value.detach().clone() for key, value in self.module.state_dict().items()},
            "optimizers": [copy.deepcopy(optimizer.state_dict()) for optimizer in self.optimizers],
        }

    def forget(self) -> None:
        """No copy to put back (not recoverable, or the step completed everywhere)."""
        self._before_step = None

    def mark(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = f"{type(error).__name__}: {error}"[:500]

    def undo(self) -> None:
        """Puts model and optimizer back to before the step (when there is a copy)."""
        if self._before_step is not None:
            self.module.load_state_dict(self._before_step["model"])
            for optimizer, saved in zip(self.optimizers, self._before_step["optimizers"], strict=True):
                optimizer.load_state_dict(saved)
                optimizer.zero_grad()
        self._before_step = None

    def allreduce(self, bucket: dist.GradBucket, world_size: int) -> torch.futures.Future[torch.Tensor]:
        """DDP's gradient all-reduce, except that a failure is recorded instead of raised."""
        tensor = bucket.buffer()
        if self.broken is not None:
            return completed(tensor)
        tensor.div_(world_size)
        try:
            work = dist.all_reduce(tensor, async_op=True)
        except RuntimeError as error:
            self.mark(error)
            return completed(tensor)
        assert work is not None

        def done(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            try:
                return future.value()[0]
            except Exception as error:  # gloo reports a dead peer as a RuntimeError
                self.mark(error)
                return tensor

        return work.get_future().then(done)
