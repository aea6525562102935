"""The warm pool: K interpreters (``python -m workers.agent.warm``) started ahead of time with
torch already imported, so a new rank skips interpreter start and ``import torch`` (seconds on a
busy host) and goes straight to init_process_group.

Cost: an idle warm interpreter holds about 300 MB RSS (torch's libraries and modules) and no
CPU; ``--warm-pool 0`` disables the pool.

Each warm process runs in its own session (its pgid is its pid, as for a cold rank), carries
the agent session marker in its environment and is watched by the reaper from the moment it is
spawned, so a SIGKILLed agent leaves no idle warm process behind; it also exits by itself when
its stdin pipe reaches EOF. ``take()`` hands one out (the supervisor adopts its Popen as the
rank's process, and supervision is the same as for a cold rank). A background thread refills
the pool (up to the local ranks of the last round started here, at most K), but only
REFILL_DELAY_SECONDS after the last launch, and imports run at the lowest CPU priority
(warm.py), so a refill does not steal CPU from ranks that are still initialising.

Only a Python command (``sys.executable script.py ...`` or ``sys.executable -m module ...``)
can use a warm process, and only when the rank's environment agrees with the warm
interpreter's start environment on every variable read at interpreter or library start
(``must_start_cold``); anything else starts cold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LAUNCH_SIGNAL = signal.SIGWINCH
"""warm.LAUNCH_SIGNAL (not imported from there: that module is the warm interpreter's)."""

DEFAULT_WARM_POOL = 2
REFILL_DELAY_SECONDS = 3.0
POOL_TICK_SECONDS = 0.2
CLOSE_WAIT_SECONDS = 5.0
TITLE_PADDING = " " * 4096
"""Room in argv for the rank's command line once a warm process becomes a rank (warm.retitle)."""

START_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC", "OMP_", "KMP_", "MKL_", "TORCH_", "CUDA_", "GOMP_")
"""Variables read when the interpreter, libc's allocator, OpenMP, MKL or torch start: a warm
process already started, so a rank that needs a different value there must start cold."""
READ_LATE = frozenset(
    {
        "OMP_NUM_THREADS",  # applied at launch with torch.set_num_threads
        "CUDA_VISIBLE_DEVICES",  # read when CUDA is first initialised, which the warm process never does
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",  # read when a NCCL process group is created
    }
)


class Watcher(Protocol):
    def watch(self, pgid: int) -> None: ...

    def forget(self, pgid: int) -> None: ...


def must_start_cold(env: dict[str, str], start_env: dict[str, str]) -> list[str]:
    """The start-time variables on which ``env`` (the rank's) differs from ``start_env`` (the
    warm interpreter's); empty when a warm process can become this rank."""
    names = set(env) | set(start_env)
    return sorted(
        name
        for name in names
        if name.startswith(START_TIME_PREFIXES)
        and name not in READ_LATE
        and env.get(name) != start_env.get(name)
    )


def warm_request(
    entrypoint: str, args: tuple[str, ...], cwd: Path | None, env: dict[str, str], stdout: Path, stderr: Path
) -> dict[str, Any] | None:
    """The launch line for a warm process, or None when the command is not a plain Python
    script or module run by this interpreter."""
    if entrypoint != sys.executable or not args:
        return None
    if args[0] == "-m":
        if len(args) < 2:
            return None
        mode, target, rest = "module", args[1], args[2:]
    elif args[0].startswith("-"):
        return None  # interpreter options (-u, -X, -c ...) only a fresh interpreter can honour
    else:
        mode, target, rest = "script", args[0], args[1:]
    return {
        "mode": mode,
        "target": target,
        "args": list(rest),
        "cwd": str(cwd) if cwd is not None else None,
        "env": env,
        "stdout": str(stdout),
        "stderr": str(stderr),
    }


def send_request(proc: subprocess.Popen[bytes], request: dict[str, Any]) -> None:
    """Hands the launch line to the warm process and closes the pipe (one launch per process).
    The signal first lifts the import priority of a process still importing (warm.py)."""
    stdin = proc.stdin
    assert stdin is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, LAUNCH_SIGNAL)
    try:
        stdin.write(json.dumps(request).encode() + b"\n")
        stdin.flush()
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


class WarmPool:
    def __init__(self, size: int, session_env: dict[str, str], watcher: Watcher, log_path: Path) -> None:
        self.size = max(0, size)
        self._watcher = watcher
        self._log_path = log_path
        self.start_env = dict(session_env)
        self._idle: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._refill_at = 0.0
        self._target = self.size
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)

    @classmethod
    def for_agent(
        cls, size: int, session_marker: tuple[str, str], watcher: Watcher, data_dir: Path
    ) -> WarmPool:
        env = os.environ.copy()
        env[session_marker[0]] = session_marker[1]
        # As a cold rank would get by default; a rank that asks for more threads gets them at launch.
        env.setdefault("OMP_NUM_THREADS", "1")
        return cls(size, env, watcher, data_dir / "warm-pool.log")

    def start(self) -> None:
        if self.size > 0:
            self._thread.start()

    def idle_pids(self) -> list[int]:
        with self._lock:
            return [proc.pid for proc in self._idle]

    def hold(self, ranks: int | None = None) -> None:
        """A round of ``ranks`` local ranks is starting on this host: no refill for
        REFILL_DELAY_SECONDS, and from then on keep only as many processes as it used (at most
        the pool size): its next round (restart, resize) is the likely next launch, and an
        interpreter nobody takes costs memory and, to start, CPU."""
        with self._lock:
            if ranks is not None:
                self._target = min(self.size, max(1, ranks))
            self._refill_at = max(self._refill_at, time.monotonic() + REFILL_DELAY_SECONDS)

    def take(self) -> subprocess.Popen[bytes] | None:
        """An idle warm process (possibly still importing: it reads its launch line as soon as
        it is done, still sooner than a cold start), or None when the pool is empty."""
        with self._lock:
            self._refill_at = max(self._refill_at, time.monotonic() + REFILL_DELAY_SECONDS)
            while self._idle:
                proc = self._idle.pop(0)
                if proc.poll() is None:
                    return proc
                self._discard(proc)
        return None

    def forget(self, pid: int) -> None:
        """A taken process that never became a rank (it was killed instead)."""
        self._watcher.forget(pid)

    def close(self) -> None:
        """Ends every idle warm process (EOF, then SIGKILL to its group) and the refill thread."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            idle, self._idle = self._idle, []
        for proc in idle:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        deadline = time.monotonic() + CLOSE_WAIT_SECONDS
        for proc in idle:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self._watcher.forget(proc.pid)

    # --- the refill thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing.wait(POOL_TICK_SECONDS):
            try:
                self._tick()
            except Exception:
                logger.exception("warm pool tick failed")

    def _tick(self) -> None:
        with self._lock:
            for proc in [p for p in self._idle if p.poll() is not None]:
                self._idle.remove(proc)
                self._discard(proc)
            if len(self._idle) >= self._target or time.monotonic() < self._refill_at:
                return
            # One at a time: each spawn imports torch, and the ranks running meanwhile need the CPU.
            proc = self._spawn()
            self._idle.append(proc)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self._log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.agent.warm", TITLE_PADDING],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=self.start_env,
                start_new_session=True,
            )
        self._watcher.watch(proc.pid)
        logger.info("warm pool: started pid %s (%s idle)", proc.pid, len(self._idle) + 1)
        return proc

    def _discard(self, proc: subprocess.Popen[bytes]) -> None:
        logger.warning(
            "warm pool: pid %s exited while idle (code %s); see %s", proc.pid, proc.returncode, self._log_path
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._watcher.forget(proc.pid)
