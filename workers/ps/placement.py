"""Where parameters live and how rows start: placement over M PS and deterministic lazy init.

Embedding row ``i`` lives on PS ``i mod M``; a dense parameter on PS ``crc32(name) mod M``
(Python's ``hash`` of a string is salted per process, so two workers would disagree). A row no
push has touched yet is never stored: it is computed on demand from (seed, table, row id) by a
counter-based hash, so any PS (a restarted one, or one of a new PS count) reproduces it exactly.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def ps_of_dense(name: str, ps_count: int) -> int:
    return zlib.crc32(name.encode()) % ps_count


def ps_of_rows(ids: torch.Tensor, ps_count: int) -> torch.Tensor:
    if bool((ids < 0).any()):
        raise ValueError("row ids must be non-negative")
    return torch.remainder(ids, ps_count)


def split_rows(ids: torch.Tensor, ps_count: int) -> list[torch.Tensor]:
    """The positions of ``ids`` that belong to each PS (positions, not ids, so replies can be
    scattered back into request order)."""
    owner = ps_of_rows(ids, ps_count)
    return [torch.nonzero(owner == ps, as_tuple=True)[0] for ps in range(ps_count)]


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def table_key(seed: int, table: str) -> int:
    base = np.array([(seed & 0xFFFFFFFF) << 32 | zlib.crc32(table.encode())], dtype=np.uint64)
    return int(_splitmix64(base)[0])


def initial_rows(seed: int, table: str, ids: torch.Tensor, dim: int, std: float) -> torch.Tensor:
    """Rows ``ids`` as they start: N(0, std^2) per element, a pure function of (seed, table, id).

    One 64-bit hash per element gives two 32-bit uniforms for a Box-Muller normal."""
    count = ids.numel()
    if std == 0 or count == 0:
        return torch.zeros(count, dim)
    with np.errstate(over="ignore"):
        rows = ids.numpy().astype(np.uint64)[:, None]
        columns = np.arange(dim, dtype=np.uint64)[None, :]
        counter = rows * np.uint64(dim) + columns + np.uint64(table_key(seed, table))
        bits = _splitmix64(counter)
    u1 = ((bits >> np.uint64(32)).astype(np.float64) + 0.5) * 2.0**-32
    u2 = ((bits & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) * 2.0**-32
    normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return torch.from_numpy((normal * std).astype(np.float32))
