"""A rank's step counter, shared with its agent through one memory-mapped file.

``sdk.step`` writes the step each completed step into an 8-byte cell of the file named by
``TRAINYARD_PROGRESS`` (the agent names one per rank): one store into a mapping, no system call
and no thread, so it costs a step nothing measurable. The agent reads the cell (``read``) once a
second for hang detection (workers/agent/hang.py) and for the heartbeats' per-rank steps. Telemetry
metrics would tell the same, but ranks other than 0 log a point only every tenth step.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from workers.protocol import ENV_PROGRESS

_CELL = struct.Struct("<q")


class ProgressCell:
    def __init__(self, path: str | None) -> None:
        self._path = path
        self._map: mmap.mmap | None = None

    def write(self, step: int) -> None:
        if self._map is None:
            if not self._path:
                return
            self._open(self._path)
            if self._map is None:
                return
        _CELL.pack_into(self._map, 0, step)

    def _open(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            self._path = None  # not writable: the agent falls back to telemetry steps
            return
        try:
            os.ftruncate(fd, _CELL.size)
            self._map = mmap.mmap(fd, _CELL.size)
        except OSError:
            self._path = None
        finally:
            os.close(fd)


_cell: ProgressCell | None = None


def cell() -> ProgressCell:
    global _cell
    if _cell is None:
        _cell = ProgressCell(os.environ.get(ENV_PROGRESS) or None)
    return _cell


def read(path: Path) -> int | None:
    """The step the rank last completed, or None before its first (or without the SDK)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(_CELL.size)
    except OSError:
        return None
    if len(data) < _CELL.size:
        return None
    return int(_CELL.unpack(data)[0])
