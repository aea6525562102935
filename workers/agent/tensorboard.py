"""Charts for plain scripts: the scalars a rank writes to TensorBoard event files, read as they
grow and shipped like the SDK's metric records (workers/agent/shipper.py).

Which files are a rank's:
- every event file in its own directory, ``TRAINYARD_TENSORBOARD_DIR`` (launcher.py sets it:
  ``<checkpoint dir>/tensorboard/round-R/rank-K``), made for this rank of this round alone;
- event files under ``runs/`` in its working directory (``SummaryWriter()``'s default log
  directory, up to ``RUNS_DEPTH`` levels down) whose name carries the pid of the rank's process
  or of one of its children, and a creation time since the rank started: TensorBoard names
  every file ``events.out.tfevents.<time>.<host>.<pid>.<n>``. The working directory of a bundle
  is shared by every job of that bundle on the host, hence the pid.

Files the SDK's own mirror writes (``SDK_SUFFIX``, workers/sdk/trackers.py) are skipped: their
points reached the console through the telemetry file already.

Reading uses TensorBoard's own loader (``EventFileLoader``), which stops at a record still being
written and picks it up on the next read. A point's sequence number is ``SEQ_BASE`` plus the
file's name hash and its place in the file: the same for every reading of the file (ingest drops
repeats after an agent restart), and never equal to an SDK record's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SDK_SUFFIX = ".trainyard-sdk"
SEQ_BASE = 1 << 40
FILE_SEQ_SPAN = 1 << 24  # events per file before sequence numbers of two files could meet
DISCOVER_SECONDS = 2.0
RUNS_DEPTH = 3
MAX_FILES = 64
MAX_SCAN_ENTRIES = 5_000
MAX_NAME = 128
PID_SLACK_SECONDS = 2.0  # a file's time is whole seconds
EVENT_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.(\d+)(.*)$")


@dataclass(frozen=True)
class EventFileName:
    time: int
    host: str
    pid: int
    suffix: str

    @classmethod
    def parse(cls, name: str) -> EventFileName | None:
        match = EVENT_FILE.match(name)
        if match is None:
            return None
        return cls(int(match.group(1)), match.group(2), int(match.group(3)), match.group(5))


def metric_name(path: Path, tag: str) -> str:
    """``add_scalars("loss", {"train": ..})`` writes tag "loss" into a directory ``loss_train``:
    that is "loss/train". Any other tag is its own name."""
    parent = path.parent.name
    if parent.startswith(tag + "_") and len(parent) > len(tag) + 1:
        return f"{tag}/{parent[len(tag) + 1 :]}"[:MAX_NAME]
    return tag[:MAX_NAME]


def scalar(value: Any) -> float | None:
    """A summary value's scalar (old-style simple_value, or a one-element tensor as
    ``add_scalar`` writes it now), None for anything else (images, histograms, text)."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    plugin = value.metadata.plugin_data.plugin_name
    if plugin not in ("", "scalars"):
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception:
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(()))


class _File:
    def __init__(self, path: Path) -> None:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        self.path = path
        self.loader = EventFileLoader(str(path))
        self.count = 0
        self.base = SEQ_BASE + (zlib.crc32(path.name.encode()) & 0xFFFFF) * FILE_SEQ_SPAN

    def records(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in self.loader.Load():
            self.count += 1
            if not event.HasField("summary") or event.step < 0:
                continue
            values: dict[str, float | None] = {}
            for value in event.summary.value:
                number = scalar(value)
                if number is not None:
                    values[metric_name(self.path, value.tag)] = number if math.isfinite(number) else None
            if values:
                out.append(
                    {
                        "kind": "metric",
                        "seq": self.base + self.count % FILE_SEQ_SPAN,
                        "t": float(event.wall_time) or time.time(),
                        "step": int(event.step),
                        "values": values,
                    }
                )
        return out


@dataclass
class ScalarFiles:
    """The event files of one rank, found and read as they grow."""

    own_dir: Path | None
    shared_dirs: list[Path]  # runs/ in the working directory, a TENSORBOARD_DIR the job set itself
    pid: int | None
    started: float
    files: dict[Path, _File] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    next_scan: float = 0.0
    broken: set[Path] = field(default_factory=set)
    changed: bool = False  # a file was found since the owner last looked (its marker lists them)

    @classmethod
    def of_files(cls, paths: list[str]) -> ScalarFiles:
        """A previous agent's rank (dead now): exactly the files it had found, read from the start."""
        found = cls(None, [], None, 0.0, next_scan=math.inf)
        for path in paths:
            found._open(Path(path))
        return found

    @property
    def paths(self) -> list[str]:
        return sorted(str(p) for p in self.files)

    def read(self, now: float | None = None, final: bool = False) -> list[dict[str, Any]]:
        """The scalar records written since the last read (``final``: the rank has exited, look
        for files once more)."""
        moment = time.monotonic() if now is None else now
        if final or moment >= self.next_scan:
            self.next_scan = moment + DISCOVER_SECONDS
            self._discover()
        records: list[dict[str, Any]] = []
        for path, reader in list(self.files.items()):
            try:
                records.extend(reader.records())
            except Exception as exc:  # a corrupt file: said once, then left alone
                logger.warning("tensorboard: cannot read %s (%s); skipped", path, exc)
                self.files.pop(path, None)
                self.broken.add(path)
        return records

    def _discover(self) -> None:
        self._note_pids()
        if self.own_dir is not None:
            for path in _event_files(self.own_dir, RUNS_DEPTH + 1):
                self._open(path)
        for shared in self.shared_dirs if self.pids else []:
            for path in _event_files(shared, RUNS_DEPTH):
                name = EventFileName.parse(path.name)
                if (
                    name is not None
                    and name.pid in self.pids
                    and name.time >= self.started - PID_SLACK_SECONDS
                ):
                    self._open(path)

    def _note_pids(self) -> None:
        if self.pid is None:
            return
        self.pids.add(self.pid)
        import psutil

        with contextlib.suppress(psutil.Error):
            self.pids.update(child.pid for child in psutil.Process(self.pid).children(recursive=True))

    def _open(self, path: Path) -> None:
        if path in self.files or path in self.broken or len(self.files) >= MAX_FILES:
            return
        if path.name.endswith(SDK_SUFFIX):
            return
        try:
            self.files[path] = _File(path)
            self.changed = True
        except Exception as exc:
            logger.warning("tensorboard: cannot open %s (%s)", path, exc)
            self.broken.add(path)


def marker_scalars(marker: Path) -> list[str]:
    """The event files a rank's shipping marker (workers/agent/shipper.py) lists: what a previous
    agent had found for it."""
    import json

    try:
        found = json.loads(marker.read_text()).get("tensorboard", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(path) for path in found] if isinstance(found, list) else []


def _event_files(root: Path, depth: int) -> list[Path]:
    """Event files under ``root`` up to ``depth`` directories down, at most MAX_SCAN_ENTRIES
    entries looked at (a runs/ directory with years of history costs a bounded scan)."""
    found: list[Path] = []
    pending = [(root, 0)]
    seen = 0
    while pending and seen < MAX_SCAN_ENTRIES:
        directory, level = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if level < depth:
                        pending.append((Path(entry.path), level + 1))
                elif entry.name.startswith("events.out.tfevents.") and entry.is_file(follow_symlinks=False):
                    found.append(Path(entry.path))
            except OSError:
                continue
    return sorted(found)


def scalar_files(spec: Any, env: dict[str, str], cwd: Path | None, pid: int) -> ScalarFiles:
    """The event files of a rank just started: its own directory (unless the job named one
    itself, which may hold other ranks' files too: then by pid, as runs/)."""
    from workers.protocol import ENV_TENSORBOARD_DIR

    workdir = cwd if cwd is not None else Path.cwd()
    chosen = spec["env"].get(ENV_TENSORBOARD_DIR)
    shared = [workdir / "runs"]
    if chosen:
        shared.append(workdir / chosen)
    own = None if chosen else Path(env[ENV_TENSORBOARD_DIR])
    return ScalarFiles(own, shared, pid, time.time())
