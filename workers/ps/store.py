"""What one PS holds: its rows of each embedding table, its dense parameters, their optimizer state.

Rows are kept in fixed-size blocks (a few MB each) rather than one growing tensor: growing a
tensor copies it, which would need twice the table's memory at that moment, and a PS running
near its memory limit would die on the copy instead of on the row budget it can report. A row is
stored only once a push updates it; a pull of an unseen row computes it from
``placement.initial_rows`` and stores nothing, so reads never grow a PS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from workers.ps.optim import OptimizerConfig, update_rows
from workers.ps.placement import initial_rows

# Bytes per block tensor: small enough that the last, partly used block wastes little of a
# memory budget, large enough that gathers touch few blocks.
BLOCK_BYTES = 4 << 20


class RowBudgetExceeded(RuntimeError):
    """Storing the rows of a push would take this PS past its row budget."""


@dataclass(frozen=True)
class TableConfig:
    name: str
    dim: int
    init_std: float
    optimizer: OptimizerConfig

    def check(self) -> None:
        if not self.name:
            raise ValueError("a table needs a name")
        if self.dim < 1:
            raise ValueError(f"table {self.name!r}: dim must be at least 1, got {self.dim}")
        if not self.init_std >= 0:
            raise ValueError(f"table {self.name!r}: init_std must be >= 0, got {self.init_std}")


@dataclass
class RowBudget:
    """Rows all tables of this PS may hold together (None: no limit)."""

    limit: int | None
    used: int = 0

    def take(self, count: int) -> None:
        if self.limit is not None and self.used + count > self.limit:
            raise RowBudgetExceeded(
                f"storing {count} more rows would exceed this PS's budget of {self.limit} rows "
                f"({self.used} held): add PS processes to shard the tables further"
            )
        self.used += count


@dataclass
class TableShard:
    """The rows of one table that this PS owns (ids with ``id % M == index``)."""

    config: TableConfig
    seed: int
    budget: RowBudget
    steps: int = 0  # updates applied to this table (Adam's bias correction)
    index: dict[int, int] = field(default_factory=dict)  # row id -> slot
    blocks: list[list[torch.Tensor]] = field(default_factory=list)  # [values, *states] per block
    ids: list[torch.Tensor] = field(default_factory=list)  # slot -> row id, per block

    @property
    def rows(self) -> int:
        return len(self.index)

    @property
    def block_rows(self) -> int:
        return max(1, BLOCK_BYTES // (4 * self.config.dim))

    @property
    def bytes_held(self) -> int:
        per_block = self.block_rows * (4 * self.config.dim * (1 + self.config.optimizer.state_slots) + 8)
        return per_block * len(self.blocks)

    def _slots(self, ids: torch.Tensor) -> np.ndarray:
        get = self.index.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), dtype=np.int64, count=ids.numel())

    def _gather(self, part: int, slots: np.ndarray) -> torch.Tensor:
        rows = self.block_rows
        block_of = slots // rows
        offset = torch.from_numpy(slots % rows)
        first = int(block_of[0]) if len(slots) else 0
        if len(slots) and (block_of == first).all():
            return self.blocks[first][part].index_select(0, offset)
        out = torch.empty(len(slots), self.config.dim)
        for block in np.unique(block_of):
            where = torch.from_numpy(np.nonzero(block_of == block)[0])
            out[where] = self.blocks[int(block)][part].index_select(0, offset[where])
        return out

    def _scatter(self, part: int, slots: np.ndarray, values: torch.Tensor) -> None:
        rows = self.block_rows
        block_of = slots // rows
        offset = torch.from_numpy(slots % rows)
        for block in np.unique(block_of):
            where = torch.from_numpy(np.nonzero(block_of == block)[0])
            self.blocks[int(block)][part].index_copy_(0, offset[where], values[where])

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        """Current values of rows ``ids`` (stored, or their initial values)."""
        slots = self._slots(ids)
        missing = slots < 0
        if not missing.any():
            return self._gather(0, slots)
        out = initial_rows(self.seed, self.config.name, ids, self.config.dim, self.config.init_std)
        present = np.nonzero(~missing)[0]
        if len(present):
            out[torch.from_numpy(present)] = self._gather(0, slots[present])
        return out

    def _create(self, ids: torch.Tensor) -> np.ndarray:
        """Stores rows ``ids`` (none stored yet) at their initial values; returns their slots."""
        self.budget.take(ids.numel())
        start = len(self.index)
        slots = np.arange(start, start + ids.numel(), dtype=np.int64)
        rows = self.block_rows
        while len(self.blocks) * rows < start + ids.numel():
            dim = self.config.dim
            self.blocks.append([torch.empty(rows, dim), *self.config.optimizer.initial_state(rows, dim)])
            self.ids.append(torch.full((rows,), -1, dtype=torch.int64))
        self._scatter(
            0, slots, initial_rows(self.seed, self.config.name, ids, self.config.dim, self.config.init_std)
        )
        for part, state in enumerate(self.config.optimizer.initial_state(ids.numel(), self.config.dim), 1):
            self._scatter(part, slots, state)
        block_of = slots // rows
        offset = torch.from_numpy(slots % rows)
        for block in np.unique(block_of):
            where = torch.from_numpy(np.nonzero(block_of == block)[0])
            self.ids[int(block)].index_copy_(0, offset[where], ids[where])
        for row, slot in zip(ids.tolist(), slots.tolist(), strict=True):
            self.index[row] = slot
        return slots

    def apply(self, ids: torch.Tensor, grads: torch.Tensor) -> None:
        """One optimizer update of rows ``ids`` (unique) with ``grads``."""
        self.steps += 1
        if ids.numel() == 0:
            return
        slots = self._slots(ids)
        missing = slots < 0
        if missing.any():
            where = np.nonzero(missing)[0]
            slots[where] = self._create(ids[torch.from_numpy(where)])
        parts = 1 + self.config.optimizer.state_slots
        gathered = [self._gather(part, slots) for part in range(parts)]
        update_rows(self.config.optimizer, gathered[0], gathered[1:], grads, self.steps)
        for part in range(parts):
            self._scatter(part, slots, gathered[part])

    def state(self) -> dict[str, Any]:
        """Rows with their optimizer state, for a checkpoint (block tensors, not concatenated,
        so writing one needs no second copy of the table in memory)."""
        used = self.rows
        rows = self.block_rows
        blocks = []
        for number, block in enumerate(self.blocks):
            count = min(rows, used - number * rows)
            if count <= 0:
                break
            blocks.append({"ids": self.ids[number][:count], "parts": [t[:count] for t in block]})
        return {"steps": self.steps, "blocks": blocks}

    def load_rows(self, ids: torch.Tensor, parts: list[torch.Tensor]) -> None:
        """Adds checkpointed rows (with their optimizer state) this PS owns."""
        if ids.numel() == 0:
            return
        slots = self._create(ids)
        for part, values in enumerate(parts):
            self._scatter(part, slots, values)


def coalesce(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums the gradients of duplicate ids: a row gets one update per push."""
    unique, inverse = torch.unique(ids, return_inverse=True)
    if unique.numel() == ids.numel():
        order = torch.argsort(inverse)
        return unique, grads[order]
    summed = torch.zeros(unique.numel(), grads.shape[1], dtype=grads.dtype)
    summed.index_add_(0, inverse, grads)
    return unique, summed


@dataclass
class DenseParameter:
    """A dense parameter this PS owns, updated by torch's own optimizer."""

    value: torch.Tensor
    config: OptimizerConfig
    optimizer: torch.optim.Optimizer

    @classmethod
    def create(cls, initial: torch.Tensor, config: OptimizerConfig) -> DenseParameter:
        value = initial.detach().clone().float().requires_grad_(True)
        return cls(value, config, config.torch_optimizer([value]))

    def apply(self, grad: torch.Tensor) -> None:
        if grad.shape != self.value.shape:
            raise ValueError(
                f"gradient of shape {tuple(grad.shape)} for a parameter of {tuple(self.value.shape)}"
            )
        self.value.grad = grad.float()
        self.optimizer.step()
        self.value.grad = None
