"""PS checkpoints: one file per PS (rows with optimizer state, dense parameters, applied batch
keys, version), written atomically; a PS of another count re-shards from a complete set.

File names carry the layout, ``ps-<index>-of-<count>.pt``. On start a PS picks the newest set
that it can use: its own file when the newest set has its count, otherwise every file of the
newest complete set of another count, keeping the rows (``id % count == index``) and dense
parameters (``crc32(name) % count == index``) it now owns. Files hold only tensors and plain
values, so they load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = 1
_NAME = re.compile(r"^ps-(\d+)-of-(\d+)\.pt$")


def file_name(index: int, count: int) -> str:
    return f"ps-{index:04d}-of-{count:04d}.pt"


def write(directory: str, index: int, count: int, state: dict[str, Any]) -> Path:
    """Writes ``state`` to a temporary file, fsyncs it and renames it over the previous one, so a
    crash at any moment leaves either the old checkpoint or the new one, never half of one."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / file_name(index, count)
    temporary = folder / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as handle:
            torch.save({"format": FORMAT, "index": index, "count": count, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return final


@dataclass(frozen=True)
class Source:
    """The checkpoint files a starting PS reads: its own, or a whole set to re-shard from."""

    count: int
    paths: tuple[Path, ...]
    reshard: bool


def choose(directory: str, index: int, count: int) -> Source | None:
    folder = Path(directory)
    if not directory or not folder.is_dir():
        return None
    groups: dict[int, dict[int, Path]] = {}
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            groups.setdefault(int(match[2]), {})[int(match[1])] = path
    usable = {
        group_count: files
        for group_count, files in groups.items()
        if group_count == count or len(files) == group_count
    }
    if not usable:
        return None

    def newest(files: dict[int, Path]) -> float:
        return max(path.stat().st_mtime for path in files.values())

    chosen = max(usable, key=lambda group_count: newest(usable[group_count]))
    if chosen == count:
        own = usable[count].get(index)
        return Source(count, (own,), reshard=False) if own is not None else None
    return Source(chosen, tuple(usable[chosen][i] for i in range(chosen)), reshard=True)


def read(source: Source) -> Iterator[dict[str, Any]]:
    """Yields the states of ``source``'s files one at a time (a re-shard never holds two whole
    files in memory)."""
    for path in source.paths:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown checkpoint format {state.get('format')!r}")
        yield state
