"""Checkpoints: atomic files, keep-last-K, DDP (rank 0 writes), sharded (DCP), asynchronous.

Layout in the checkpoint directory: ``step-000000120.pt`` (whole state, torch.save) or
``step-000000120.dcp/`` (torch.distributed.checkpoint, one shard per rank). A file or directory
only ever appears under its final name complete: it is written under a temporary name, fsynced,
then renamed, and the directory entry is fsynced too.
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import shutil
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workers import protocol
from workers.sdk.telemetry import telemetry

DEFAULT_KEEP = 3
_NAME = re.compile(r"^step-(\d{9,})\.(pt|dcp)$")


class CheckpointError(RuntimeError):
    pass


def checkpoint_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    chosen = directory or os.environ.get(protocol.ENV_CHECKPOINT_DIR) or "checkpoints"
    return Path(chosen)


def _keep(keep: int | None) -> int:
    if keep is not None:
        return max(1, keep)
    return max(1, int(os.environ.get("TRAINYARD_CHECKPOINT_KEEP", DEFAULT_KEEP) or DEFAULT_KEEP))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entries(directory: Path, suffix: str) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and match.group(2) == suffix:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _prune(directory: Path, suffix: str, keep: int) -> None:
    for _, old in _entries(directory, suffix)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _write_atomic(state: Any, final: Path) -> int:
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        size = temporary.stat().st_size
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)
    return size


def _record(step: int, path: Path, size: int, blocking_ms: float) -> None:
    telemetry().emit(
        "checkpoint", step=step, path=str(path), size_bytes=size, blocking_ms=round(blocking_ms, 3)
    )


def save(
    state: Any,
    step: int,
    directory: str | os.PathLike[str] | None = None,
    keep: int | None = None,
) -> Path:
    """Writes ``state`` for ``step`` (rank 0 only; the other ranks wait on a barrier)."""
    started = time.perf_counter()
    target = checkpoint_dir(directory)
    final = target / f"step-{step:09d}.pt"
    if _rank() == 0:
        size = _write_atomic(state, final)
        _prune(target, "pt", _keep(keep))
        _record(step, final, size, (time.perf_counter() - started) * 1000)
    if _distributed():
        dist.barrier()
    return final


def latest_step(directory: str | os.PathLike[str] | None = None) -> int | None:
    entries = _entries(checkpoint_dir(directory), "pt")
    return entries[-1][0] if entries else None


def load_latest(
    directory: str | os.PathLike[str] | None = None,
    map_location: str | torch.device = "cpu",
    weights_only: bool = True,
    collective: bool = False,
) -> tuple[Any, int] | None:
    """Returns ``(state, step)`` of the newest readable checkpoint, or None when there is none.

    ``collective=True`` (every rank must call it): the ranks compare the step each one found;
    when they differ (hosts without a shared checkpoint directory), rank 0's checkpoint is sent
    to all, so every rank resumes from the same step.
    """
    found = _load_local(directory, map_location, weights_only)
    if not (collective and _distributed()):
        return found
    steps: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(steps, found[1] if found else -1)
    if len(set(steps)) == 1:
        return found
    payload = [found if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(payload, src=0)
    shared = payload[0]
    if shared is None:
        return None
    state, step = shared
    if map_location != "cpu":
        state = _move(state, torch.device(map_location))
    return state, step


def _move(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_move(v, device) for v in obj)
    return obj


def _load_local(
    directory: str | os.PathLike[str] | None, map_location: str | torch.device, weights_only: bool
) -> tuple[Any, int] | None:
    for step, path in reversed(_entries(checkpoint_dir(directory), "pt")):
        try:
            state = torch.load(path, map_location=map_location, weights_only=weights_only)
        except (EOFError, RuntimeError, pickle.UnpicklingError) as error:
            if isinstance(error, pickle.UnpicklingError) and zipfile.is_zipfile(path):
                # An intact file holding objects weights_only refuses: the caller must decide.
                raise
            # A damaged file (disk trouble; rename keeps partial writes out) must not block resume.
            telemetry().event(
                "checkpoint_unreadable", "warning", f"{path.name}: {error}", {"step": step, "path": str(path)}
            )
            continue
        return state, step
    return None


# --- sharded (torch.distributed.checkpoint) ------------------------------------------------


def save_sharded(
    state: dict[str, Any],
    step: int,
    directory: str | os.PathLike[str] | None = None,
    keep: int | None = None,
) -> Path:
    """Every rank writes its shards; collective: all ranks must call it."""
    import torch.distributed.checkpoint as dcp

    started = time.perf_counter()
    target = checkpoint_dir(directory)
    final = target / f"step-{step:09d}.dcp"
    temporary = target / f".step-{step:09d}.dcp.tmp"
    if _rank() == 0:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    if _distributed():
        dist.barrier()
    dcp.save(state, checkpoint_id=str(temporary))
    if _distributed():
        dist.barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(temporary, final)
        _fsync_dir(target)
        _prune(target, "dcp", _keep(keep))
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        _record(step, final, size, (time.perf_counter() - started) * 1000)
    if _distributed():
        dist.barrier()
    return final


def load_sharded(state: dict[str, Any], directory: str | os.PathLike[str] | None = None) -> int | None:
    """Loads the newest sharded checkpoint into ``state`` in place; returns its step or None."""
    import torch.distributed.checkpoint as dcp

    entries = _entries(checkpoint_dir(directory), "dcp")
    if not entries:
        return None
    step, path = entries[-1]
    dcp.load(state, checkpoint_id=str(path))
    return step


# --- asynchronous (snapshot to host memory, persist in the background) ---------------------


def _flatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Replaces every tensor by its index in ``tensors``; returns the skeleton."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        return {k: _flatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, tensors) for v in obj)
    return obj


def _rebuild(skeleton: Any, buffers: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, _Slot):
        return buffers[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: _rebuild(v, buffers) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_rebuild(v, buffers) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(_rebuild(v, buffers) for v in skeleton)
    return skeleton


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class AsyncCheckpointer:
    """Flash-checkpoint style saves: the caller blocks only for a copy into host memory.

    ``save`` first waits for the previous persist (so at most one snapshot is in flight and
    its buffers can be reused), copies every tensor into pre-allocated host buffers (pinned when
    CUDA is present, so device-to-host copies are plain DMA), then a background thread writes the
    snapshot atomically. ``wait()`` joins it and re-raises a failure. Only rank 0 writes.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, keep: int | None = None) -> None:
        self.directory = checkpoint_dir(directory)
        self.keep = _keep(keep)
        self._buffers: list[torch.Tensor] = []
        self._signature: list[tuple[torch.Size, torch.dtype, bool]] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_blocking_ms = 0.0
        self.last_path: Path | None = None
        atexit.register(self._wait_quietly)

    def save(self, state: Any, step: int) -> Path:
        final = self.directory / f"step-{step:09d}.pt"
        if _rank() != 0:
            return final
        started = time.perf_counter()
        self.wait()
        tensors: list[torch.Tensor] = []
        skeleton = _flatten(state, tensors)
        self._ensure_buffers(tensors)
        with torch.no_grad():
            for buffer, tensor in zip(self._buffers, tensors, strict=True):
                if tensor.is_sparse:
                    continue
                buffer.copy_(tensor.detach(), non_blocking=buffer.is_pinned())
            if any(b.is_pinned() for b in self._buffers) and torch.cuda.is_available():
                torch.cuda.synchronize()
        snapshot = [
            t.detach().to("cpu", copy=True) if t.is_sparse else b
            for b, t in zip(self._buffers, tensors, strict=True)
        ]
        blocking_ms = (time.perf_counter() - started) * 1000
        self.last_blocking_ms = blocking_ms
        self.last_path = final

        def persist() -> None:
            try:
                size = _write_atomic(_rebuild(skeleton, snapshot), final)
                _prune(self.directory, "pt", self.keep)
                _record(step, final, size, blocking_ms)
            except BaseException as error:
                self._error = error

        self._thread = threading.Thread(target=persist, name="trainyard-checkpoint", daemon=False)
        self._thread.start()
        return final

    def _ensure_buffers(self, tensors: list[torch.Tensor]) -> None:
        signature = [(t.shape, t.dtype, t.is_sparse) for t in tensors]
        if signature == self._signature:
            return
        pin = torch.cuda.is_available()
        self._buffers = [
            torch.empty(0)
            if t.is_sparse
            else torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            for t in tensors
        ]
        self._signature = signature

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background checkpoint write failed: {error}") from error

    def _wait_quietly(self) -> None:
        if self._thread is not None:
            self._thread.join()


_async: AsyncCheckpointer | None = None


def save_async(
    state: Any, step: int, directory: str | os.PathLike[str] | None = None, keep: int | None = None
) -> Path:
    """``save`` that returns after the host-memory copy; see AsyncCheckpointer."""
    global _async
    wanted = checkpoint_dir(directory)
    if _async is None or _async.directory != wanted:
        if _async is not None:
            _async.wait()
        _async = AsyncCheckpointer(wanted, keep)
    return _async.save(state, step)


def wait() -> None:
    """Blocks until the last asynchronous save is on disk."""
    if _async is not None:
        _async.wait()
