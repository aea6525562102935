"""Reading a rank's stacks from outside its process: py-spy (PyPI ``py-spy``, a Rust binary
installed with the project) for Python frames, native ones where it can, and NCCL's Flight
Recorder dump where the rank wrote one.

``py-spy dump --native`` suspends the process (ptrace) to unwind its native stack; that fails on a
process that is already stopped (SIGSTOP: "Failed to suspend process") and on interpreters it
cannot unwind, so the dump falls back to ``--nonblocking`` (reads the interpreter's memory while
the process runs or stays stopped; Python frames only). A dump that still fails says why in
``error``.

NCCL Flight Recorder (unverified here: no GPU): with ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0 and
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` (the launcher sets both for ranks with GPUs), a rank whose
collective times out writes its trace to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + its rank
(torch's ``_dump_nccl_trace``, a pickle; the launcher points that prefix into the rank's
directory); ``flight_recorder_dump`` finds the file and the hang report names it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from workers.protocol import StackFrame, ThreadStack

logger = logging.getLogger(__name__)

DUMP_TIMEOUT_SECONDS = 10.0
# Where NCCL's Flight Recorder writes (TORCH_NCCL_DEBUG_INFO_TEMP_FILE; the rank is appended).
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"


def py_spy() -> str | None:
    """The py-spy binary: beside this interpreter (the project's venv), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def dump(pid: int, *, native: bool = True, stopped: bool = False) -> tuple[list[ThreadStack], bool, str]:
    """(threads, native, error) of process ``pid``: its threads' stacks, innermost frame first, the
    main thread first."""
    binary = py_spy()
    if binary is None:
        return [], False, "py-spy is not installed"
    attempts = [("--nonblocking",)] if stopped or not native else [("--native",), ("--nonblocking",)]
    error = ""
    for flags in attempts:
        try:
            done = subprocess.run(
                [binary, "dump", "--pid", str(pid), "--json", *flags],
                capture_output=True,
                timeout=DUMP_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = f"py-spy: {exc}"
            continue
        if done.returncode == 0:
            try:
                return parse(json.loads(done.stdout), pid), flags == ("--native",), ""
            except (ValueError, TypeError, KeyError) as exc:
                error = f"py-spy gave unreadable output: {exc}"
                continue
        error = _first_line(done.stderr) or f"py-spy exited with {done.returncode}"
    return [], False, error


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            return line.strip().removeprefix("Error: ")
    return ""


def parse(traces: list[dict[str, Any]], pid: int) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    for trace in traces:
        frames: list[StackFrame] = [
            {
                "name": str(frame.get("name") or "?"),
                "file": str(frame.get("short_filename") or frame.get("filename") or "?"),
                "line": int(frame.get("line") or 0),
            }
            for frame in trace.get("frames") or []
        ]
        name = trace.get("thread_name") or f"thread {trace.get('os_thread_id') or trace.get('thread_id')}"
        main = trace.get("os_thread_id") == pid
        stack: ThreadStack = {
            "name": "MainThread" if main else str(name),
            "idle": not trace.get("active"),
            "frames": frames,
        }
        threads.insert(0, stack) if main else threads.append(stack)
    return threads


def signature(threads: list[ThreadStack]) -> tuple[Any, ...]:
    """The main thread's frames, for comparing two samples of one rank."""
    if not threads:
        return ()
    return tuple((f["name"], f["file"], f["line"]) for f in threads[0]["frames"])


def flight_recorder_dump(directory: Path, rank: int) -> str:
    """The path of the NCCL Flight Recorder dump rank ``rank`` wrote into its directory (the
    launcher points TORCH_NCCL_DEBUG_INFO_TEMP_FILE there), or "" (none, or no NCCL)."""
    path = directory / f"{FLIGHT_RECORDER_PREFIX}{rank}"
    return str(path) if path.is_file() else ""
