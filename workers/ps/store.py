"""What one PS holds: its rows of each embedding table, its dense parameters, their optimizer state.

Rows are kept in blocks that double in size (1 MiB up to 256 MiB each) rather than one growing
tensor: growing a tensor copies it, which would need twice the table's memory at that moment, and
a PS running near its memory limit would die on the copy instead of on the row budget it can
report. Doubling keeps the number of blocks, and so the per-block work of a gather, logarithmic;
under a row budget the last block is cut to what the budget still allows. A row is
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

# Bytes of the first and of the largest block tensor.
FIRST_BLOCK_BYTES = 1 << 20
MAX_BLOCK_BYTES = 256 << 20


# (block, positions in a slot array or None for all of them, offsets in the block)
Group = tuple[int, torch.Tensor | None, torch.Tensor]


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
        if self.optimizer.name == "assign":
            raise ValueError(f"table {self.name!r}: the assign optimizer is for dense parameters only")


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
    starts: list[int] = field(default_factory=list)  # first slot of each block, then the capacity

    @property
    def rows(self) -> int:
        return len(self.index)

    @property
    def capacity(self) -> int:
        return int(self.starts[-1]) if self.starts else 0

    @property
    def bytes_held(self) -> int:
        per_row = 4 * self.config.dim * (1 + self.config.optimizer.state_slots) + 8
        return per_row * self.capacity

    def _slots(self, ids: torch.Tensor) -> np.ndarray:
        get = self.index.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), dtype=np.int64, count=ids.numel())

    def _groups(self, slots: np.ndarray) -> list[Group]:
        """(block, positions in ``slots`` or None for all of them, offsets in the block)."""
        bounds = np.asarray(self.starts)
        block_of = np.searchsorted(bounds, slots, side="right") - 1
        offsets = slots - bounds[block_of]
        if len(slots) and (block_of == block_of[0]).all():
            return [(int(block_of[0]), None, torch.from_numpy(offsets))]
        order = np.argsort(block_of, kind="stable")
        edges = np.flatnonzero(np.diff(block_of[order])) + 1
        groups: list[Group] = []
        for positions in np.split(order, edges):
            if len(positions):
                groups.append(
                    (
                        int(block_of[positions[0]]),
                        torch.from_numpy(positions),
                        torch.from_numpy(offsets[positions]),
                    )
                )
        return groups

    def _gather(self, part: int, slots: np.ndarray, groups: list[Group] | None = None) -> torch.Tensor:
        groups = groups if groups is not None else self._groups(slots)
        if len(groups) == 1 and groups[0][1] is None:
            return self.blocks[groups[0][0]][part].index_select(0, groups[0][2])
        out = torch.empty(len(slots), self.config.dim)
        for block, where, offsets in groups:
            out[where] = self.blocks[block][part].index_select(0, offsets)
        return out

    def _scatter(
        self, part: int, slots: np.ndarray, values: torch.Tensor, groups: list[Group] | None = None
    ) -> None:
        for block, where, offsets in groups if groups is not None else self._groups(slots):
            chosen = values if where is None else values[where]
            self.blocks[block][part].index_copy_(0, offsets, chosen)

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
        needed = start + ids.numel()
        dim = self.config.dim
        while self.capacity < needed:
            first = max(1, FIRST_BLOCK_BYTES // (4 * dim))
            rows = min(first << len(self.blocks), max(1, MAX_BLOCK_BYTES // (4 * dim)))
            if self.budget.limit is not None:
                rows = max(needed - self.capacity, min(rows, self.budget.limit - self.capacity))
            self.blocks.append([torch.empty(rows, dim), *self.config.optimizer.initial_state(rows, dim)])
            self.ids.append(torch.full((rows,), -1, dtype=torch.int64))
            if not self.starts:
                self.starts.append(0)
            self.starts.append(self.capacity + rows)
        slots = np.arange(start, needed, dtype=np.int64)
        groups = self._groups(slots)
        self._scatter(
            0, slots, initial_rows(self.seed, self.config.name, ids, dim, self.config.init_std), groups
        )
        for part, state in enumerate(self.config.optimizer.initial_state(ids.numel(), dim), 1):
            self._scatter(part, slots, state, groups)
        for block, where, offsets in groups:
            self.ids[block].index_copy_(0, offsets, ids if where is None else ids[where])
        self.index.update(zip(ids.tolist(), slots.tolist(), strict=True))
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
        groups = self._groups(slots)
        gathered = [self._gather(part, slots, groups) for part in range(parts)]
        update_rows(self.config.optimizer, gathered[0], gathered[1:], grads, self.steps)
        for part in range(parts):
            self._scatter(part, slots, gathered[part], groups)

    def state(self) -> dict[str, Any]:
        """Rows with their optimizer state, for a checkpoint (block tensors, not concatenated,
        so writing one needs no second copy of the table in memory)."""
        used = self.rows
        blocks = []
        for number, block in enumerate(self.blocks):
            count = min(self.starts[number + 1], used) - self.starts[number]
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
        if self.config.name == "assign":
            with torch.no_grad():
                self.value.copy_(grad.float())  # a saved value, not a gradient
            return
        self.value.grad = grad.float()
        self.optimizer.step()
        self.value.grad = None
