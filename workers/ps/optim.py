"""Optimizers applied on the PS: per-row updates for embedding rows, torch's own for dense ones.

Row updates follow torch's sparse formulas, so a synchronous PS run matches single-process
training with the same optimizer: ``sgd`` as ``torch.optim.SGD``, ``adagrad`` as
``torch.optim.Adagrad`` (per-row accumulator), ``adam`` as ``torch.optim.SparseAdam`` (per-row
first and second moments; the bias correction counts the table's updates, like SparseAdam's
per-parameter step, rather than each row's own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workers.ps import ps_pb2

NAMES = ("sgd", "adagrad", "adam", "assign")
# ``assign``: a dense parameter the PS only keeps, set to each value pushed (a hybrid job's dense
# weights, saved by its first worker so that a new worker round starts from them); not for tables.
ASSIGN = "assign"


class OptimizerError(ValueError):
    """An optimizer declaration the PS refuses."""


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    initial_accumulator: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise OptimizerError(f"optimizer must be one of {', '.join(NAMES)}, got {self.name!r}")
        if not self.lr >= 0 or not math.isfinite(self.lr):
            raise OptimizerError(f"lr must be a finite number >= 0, got {self.lr}")
        if self.name == "adam" and not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise OptimizerError(f"adam betas must be in [0, 1), got {self.beta1}, {self.beta2}")

    @property
    def state_slots(self) -> int:
        """Per-row state tensors, each as wide as the row."""
        return {"sgd": 0, "adagrad": 1, "adam": 2, "assign": 0}[self.name]

    def initial_state(self, count: int, dim: int) -> list[torch.Tensor]:
        if self.name == "adagrad":
            return [torch.full((count, dim), self.initial_accumulator)]
        return [torch.zeros(count, dim) for _ in range(self.state_slots)]

    def to_proto(self) -> ps_pb2.OptimizerSpec:
        return ps_pb2.OptimizerSpec(
            name=self.name,
            lr=self.lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            initial_accumulator=self.initial_accumulator,
        )

    @classmethod
    def from_proto(cls, spec: ps_pb2.OptimizerSpec) -> OptimizerConfig:
        return cls(
            name=spec.name or "sgd",
            lr=spec.lr,
            beta1=spec.beta1,
            beta2=spec.beta2,
            eps=spec.eps,
            initial_accumulator=spec.initial_accumulator,
        )

    def torch_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """For dense parameters on the PS (and for single-process references in tests)."""
        if self.name in ("sgd", ASSIGN):
            return torch.optim.SGD(params, lr=self.lr)  # assign: unused (DenseParameter.apply)
        if self.name == "adagrad":
            return torch.optim.Adagrad(
                params, lr=self.lr, eps=self.eps, initial_accumulator_value=self.initial_accumulator
            )
        return torch.optim.Adam(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps)

    def torch_sparse_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The torch optimizer the row update reproduces (tests compare against it)."""
        if self.name == "adam":
            return torch.optim.SparseAdam(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps)
        return self.torch_optimizer(params)


def update_rows(
    config: OptimizerConfig, values: torch.Tensor, states: list[torch.Tensor], grads: torch.Tensor, step: int
) -> None:
    """Applies one update in place to gathered rows ``values`` and their ``states``.

    ``grads`` has one row per value row (duplicates already summed); ``step`` counts this
    update (1 for the first) for Adam's bias correction."""
    if config.name == "sgd":
        values.add_(grads, alpha=-config.lr)
        return
    if config.name == "adagrad":
        (accumulator,) = states
        accumulator.add_(grads.pow(2))
        std = accumulator.sqrt().add_(config.eps)
        values.add_(grads / std, alpha=-config.lr)
        return
    exp_avg, exp_avg_sq = states
    # Same operations in the same order as torch's sparse_adam, so fp32 results agree.
    old_avg = exp_avg.clone()
    old_sq = exp_avg_sq.clone()
    avg_update = grads.sub(old_avg).mul_(1 - config.beta1)
    exp_avg.add_(avg_update)
    sq_update = grads.pow(2).sub_(old_sq).mul_(1 - config.beta2)
    exp_avg_sq.add_(sq_update)
    numer = avg_update.add_(old_avg)
    denom = sq_update.add_(old_sq).sqrt_().add_(config.eps)
    bias_correction1 = 1 - config.beta1**step
    bias_correction2 = 1 - config.beta2**step
    step_size = config.lr * math.sqrt(bias_correction2) / bias_correction1
    values.add_(-step_size * numer.div_(denom))
