"""Telemetry sink of the SDK: JSON lines for the agent, or a compact console line outside it.

Records follow workers/protocol.py. The training loop only appends a small dict to a list; a
daemon thread serialises and writes the batch every ``FLUSH_INTERVAL`` seconds, so a step never
waits on disk. Tensor scalars are converted in that thread too, which keeps ``.item()`` (a device
synchronisation on GPU) off the training thread.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from typing import Any

from workers import protocol

# The agent tails these files; 0.2 s keeps the live charts fresh while a write costs one syscall
# per interval, not per call.
FLUSH_INTERVAL = 0.2
# How often a run outside the console prints a line, unless TRAINYARD_PRINT_EVERY says otherwise.
DEFAULT_PRINT_EVERY = 10
# SDK statistics that the printed line outside the console carries (the rest only go to the console).
PRINTED_STATISTICS = ("step_time_s", "samples_per_s", "tokens_per_s", "grad_norm")


def env_rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def _scalar(value: Any) -> float | int | None:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    number = float(value)
    # JSON has no NaN/Inf; a diverged loss is still worth seeing, as null.
    return number if math.isfinite(number) else None


class Telemetry:
    """Buffered writer for one rank. ``path`` None means "not inside the console"."""

    def __init__(self, path: str | None, print_every: int, rank: int) -> None:
        self.path = path.replace("{rank}", str(rank)) if path else None
        self.print_every = print_every
        self.rank = rank
        self._buffer: list[dict[str, Any]] = []
        # _lock guards only the list swap, so the training thread never waits on serialising;
        # _write_lock keeps flushes from two threads (timer and atexit) in order.
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._fd: int | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._pid = os.getpid()
        self._pending: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _start(self) -> None:
        # Lazily, so importing the SDK costs nothing and a forked child starts its own thread.
        assert self.path is not None
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        # O_APPEND: several ranks may share one file; each flush is a single write of whole lines.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._thread = threading.Thread(target=self._run, name="trainyard-telemetry", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def emit(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        if self._thread is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._start()
        seq = self._seq.get(kind, 0) + 1
        self._seq[kind] = seq
        fields["kind"] = kind
        fields["seq"] = seq
        fields["t"] = time.time()
        with self._lock:
            self._buffer.append(fields)

    def metric(self, step: int, values: dict[str, Any], echo: bool = True) -> None:
        """``echo=False`` (SDK statistics): outside the console, shown only on the next printed line."""
        if self.path is not None:
            self.emit("metric", step=step, values=values)
            return
        if self.print_every <= 0 or self.rank != 0:
            return
        if not echo:
            for name in PRINTED_STATISTICS:
                if name in values:
                    self._pending[name] = values[name]
            return
        if step % self.print_every == 0:
            shown = " | ".join(f"{name} {_format(v)}" for name, v in {**values, **self._pending}.items())
            self._pending = {}
            print(f"[step {step}] {shown}", flush=True)

    def event(self, event: str, severity: str, message: str, data: dict[str, Any]) -> None:
        if self.path is not None:
            self.emit("event", event=event, severity=severity, message=message, data=data)
        else:
            print(f"[trainyard {severity}] {event}: {message}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self._closed.wait(FLUSH_INTERVAL):
            self.flush()

    def flush(self) -> None:
        with self._write_lock:
            with self._lock:
                if not self._buffer or self._fd is None:
                    return
                batch, self._buffer = self._buffer, []
            lines = []
            for record in batch:
                values = record.get("values")
                if values is not None:
                    record["values"] = {k: _scalar(v) for k, v in values.items()}
                lines.append(json.dumps(record, separators=(",", ":")))
            data = ("\n".join(lines) + "\n").encode()
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]

    def close(self) -> None:
        self._closed.set()
        self.flush()
        with self._write_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _format(value: Any) -> str:
    number = _scalar(value)
    if number is None:
        return "nan"
    if isinstance(number, int):
        return str(number)
    return f"{number:.4g}"


_telemetry: Telemetry | None = None


def telemetry() -> Telemetry:
    global _telemetry
    if _telemetry is None:
        every = int(os.environ.get("TRAINYARD_PRINT_EVERY", DEFAULT_PRINT_EVERY) or 0)
        _telemetry = Telemetry(os.environ.get(protocol.ENV_TELEMETRY) or None, every, env_rank())
    return _telemetry
