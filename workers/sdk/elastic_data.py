"""The data position of an in-place run (:mod:`workers.sdk.elastic`), split by rank.

The epoch's examples are a fixed permutation (:func:`epoch_order`); the SDK keeps the global
position in it and every step splits the next ``world_size * batch_size`` examples by rank
(:func:`rank_slice`), so after a re-form the remainder is re-split over the new world and no
example is skipped or repeated.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol

import torch


class IndexedDataset(Sized, Protocol):
    def __getitem__(self, index: int) -> Any: ...


def epoch_order(size: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of an epoch's examples; the same on every rank and every round."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


def rank_slice(position: int, remaining: int, world_size: int, rank: int, batch_size: int) -> tuple[int, int]:
    """This rank's [start, end) in the epoch order for the step that begins at ``position``.

    A full step takes ``world_size * batch_size`` examples, rank r the r-th batch of them; the last
    step of an epoch splits what is left as evenly as possible (a rank may get nothing when fewer
    examples than ranks remain)."""
    if remaining >= world_size * batch_size:
        start = position + rank * batch_size
        return start, start + batch_size
    base, extra = divmod(remaining, world_size)
    start = position + rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
