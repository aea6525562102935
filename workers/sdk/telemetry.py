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
from collections import deque
from typing import Any

from workers import protocol

# The agent tails these files. 0.1 s keeps log() -> browser at p95 ~0.2 s (bench/telemetry; 0.2 s
# here made it ~0.38 s) while a write costs one syscall per interval, not per call; 0.05 s cost a
# tiny step (0.8 ms, bench/sdk) measurably more in GIL hand-offs to this thread.
FLUSH_INTERVAL = 0.1
# How often a run outside the console prints a line, unless TRAINYARD_PRINT_EVERY says otherwise.
DEFAULT_PRINT_EVERY = 10
# SDK statistics that the printed line outside the console carries (the rest only go to the console).
PRINTED_STATISTICS = ("step_time_s", "samples_per_s", "tokens_per_s", "grad_norm")


_PLAIN = (float, int)


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
    """Buffered writer for one rank. ``path`` None means "not inside the console".

    The hot path (``metric``) appends one tuple to a deque (atomic in CPython, no lock) and
    stamps the time; sequence numbers, scalar conversion and JSON are the flusher's work.
    """

    def __init__(self, path: str | None, print_every: int, rank: int) -> None:
        self.path = path.replace("{rank}", str(rank)) if path else None
        self.print_every = print_every
        self.rank = rank
        self._queue: deque[tuple[str, int, float, Any]] = deque()
        # Keeps flushes from two threads (timer and atexit) from interleaving their lines.
        self._write_lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._keys: dict[str, str] = {}
        self._fd: int | None = None
        self._started = False
        self._closed = threading.Event()
        self._pending: dict[str, Any] = {}
        os.register_at_fork(after_in_child=self._forget_thread)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _forget_thread(self) -> None:
        # A forked child (DataLoader worker) has no flusher thread; it starts its own on first use.
        self._started = False
        self._queue.clear()
        self._closed = threading.Event()

    def _start(self) -> None:
        assert self.path is not None
        self._started = True
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        # O_APPEND: several ranks may share one file; each flush is a single write of whole lines.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        thread = threading.Thread(target=self._run, name="trainyard-telemetry", daemon=True)
        thread.start()
        atexit.register(self.close)

    def emit(self, kind: str, **fields: Any) -> None:
        """Any record of the protocol; ``kind``, ``seq`` and ``t`` are filled in."""
        if self.path is None:
            return
        if not self._started:
            self._start()
        self._queue.append((kind, fields.pop("step", -1), time.time(), fields))

    def metric(self, step: int, values: dict[str, Any], echo: bool = True) -> None:
        """``echo=False`` (SDK statistics): outside the console, shown only on the next printed line."""
        if self.path is not None:
            if not self._started:
                self._start()
            for name, value in values.items():
                # CPU tensors become floats now: cheap, and a queue of dicts holding tensors makes
                # the garbage collector's full passes far more frequent. CUDA tensors wait for the
                # flusher, so the training thread never synchronises with the device.
                if (
                    type(value) not in _PLAIN
                    and hasattr(value, "item")
                    and not getattr(value, "is_cuda", False)
                ):
                    values[name] = value.item()
            self._queue.append(("metric", step, time.time(), values))
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
        closed = self._closed
        while not closed.wait(FLUSH_INTERVAL):
            self.flush()

    def _key(self, name: str) -> str:
        encoded = self._keys.get(name)
        if encoded is None:
            encoded = self._keys[name] = json.dumps(name)
        return encoded

    def _line(self, kind: str, step: int, t: float, payload: Any) -> str:
        seq = self._seq.get(kind, 0) + 1
        self._seq[kind] = seq
        if kind == "metric":
            # Formatted by hand: several times cheaper than json.dumps for the common record.
            parts = []
            for name, value in payload.items():
                number = _scalar(value)
                parts.append(f"{self._key(name)}:{'null' if number is None else repr(number)}")
            values = ",".join(parts)
            return f'{{"kind":"metric","seq":{seq},"t":{t:.6f},"step":{step},"values":{{{values}}}}}'
        record = {"kind": kind, "seq": seq, "t": round(t, 6)}
        if step != -1:
            record["step"] = step
        record.update(payload)
        return json.dumps(record, separators=(",", ":"), default=str)

    def flush(self) -> None:
        with self._write_lock:
            if self._fd is None or not self._queue:
                return
            lines = []
            queue = self._queue
            while queue:
                lines.append(self._line(*queue.popleft()))
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
