"""The warm pool: interpreters (``python -m workers.agent.warm``) started ahead of time with
torch already imported, so a new rank skips interpreter start and the torch import (seconds on a
busy host) and goes straight to its script (warm.preload says what is not preloaded, and why).

Size: up to twice the local ranks of the last round started here (at most ``--warm-pool``,
default DEFAULT_WARM_POOL; every slot before the first round): one round's worth for the next
launch and one more, so that a restart or resize right after a launch still finds a round's
worth ready even when the refill has had no CPU to run. Cost: an idle warm interpreter holds
about 300 MB RSS (torch's libraries and modules, much of it shared file pages) and no CPU;
``--warm-pool 0`` disables the pool.

Refilling only uses CPU the ranks leave idle. Imports run at the lowest priority (warm.py), and
the refill thread meters the host: over the last METER_WINDOW_SECONDS, how many cores were idle
apart from the pool's own imports. It runs one import per such idle core, none within
REFILL_DELAY_SECONDS of a launch (while ranks initialise). An import already
under way is paused (SIGSTOP) when the spare CPU drops below PAUSE_BELOW_SPARE_CPUS and resumed
(SIGCONT) when it is back: on a host whose cores the ranks keep busy (2 ranks on 2 cores here)
even a niced import took 10-25 % of the training throughput, because it ran in every gap
between the ranks' collectives. Each warm interpreter writes one byte on its stdout pipe when
its imports are done; ``take()`` prefers those.

Each warm process runs in its own session (its pgid is its pid, as for a cold rank), carries
the agent session marker in its environment and is watched by the reaper from the moment it is
spawned, so a SIGKILLed agent leaves no idle warm process behind (SIGKILL also ends a paused
one); it also exits by itself when its stdin pipe reaches EOF. ``take()`` hands one out (the
supervisor adopts its Popen as the rank's process, and supervision is the same as for a cold
rank).

Only a Python command (``sys.executable script.py ...`` or ``sys.executable -m module ...``)
can use a warm process, and only when the rank's environment agrees with the warm
interpreter's start environment on every variable read at interpreter or library start
(``must_start_cold``); anything else starts cold.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workers.agent.environment import inherited

logger = logging.getLogger(__name__)

LAUNCH_SIGNAL = signal.SIGWINCH
"""warm.LAUNCH_SIGNAL (not imported from there: that module is the warm interpreter's)."""

DEFAULT_WARM_POOL = 4
ROUNDS_AHEAD = 2
"""The pool aims at this many rounds' worth of the last round's local ranks."""
REFILL_DELAY_SECONDS = 1.0
POOL_TICK_SECONDS = 0.2
METER_WINDOW_SECONDS = 1.0
MIN_SPARE_CPUS = 1.0
"""Idle cores (not counting the pool's imports) needed to start or resume an import."""
PAUSE_BELOW_SPARE_CPUS = 0.75
"""Below this many idle cores an import under way is paused (hysteresis against flapping)."""
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


def parse_python_command(entrypoint: str, args: tuple[str, ...]) -> tuple[str, str, tuple[str, ...]] | None:
    """("script", path, args) for ``sys.executable path args``, ("module", name, args) for
    ``sys.executable -m name args``; None for anything else."""
    if entrypoint != sys.executable or not args:
        return None
    if args[0] == "-m":
        if len(args) < 2:
            return None
        return "module", args[1], args[2:]
    if args[0].startswith("-"):
        return None  # interpreter options (-u, -X, -c ...): run as given
    return "script", args[0], args[1:]


def warm_request(
    entrypoint: str, args: tuple[str, ...], cwd: Path | None, env: dict[str, str], stdout: Path, stderr: Path
) -> dict[str, Any] | None:
    """The launch line for a warm process, or None when the command is not a plain Python
    script or module run by this interpreter."""
    python = parse_python_command(entrypoint, args)
    if python is None:
        return None
    mode, target, rest = python
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
    """Hands the launch line to the warm process and closes the pipe (one launch per process),
    then signals it: the signal lifts the import priority of a process still importing, and one
    that arrives before the process has its handler finds the line already there (warm.py)."""
    stdin = proc.stdin
    assert stdin is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)  # a paused import goes on, now for the rank
    try:
        stdin.write(json.dumps(request).encode() + b"\n")
        stdin.flush()
    finally:
        with contextlib.suppress(OSError):
            stdin.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, LAUNCH_SIGNAL)


class CpuMeter:
    """How many cores were idle over the last ``window`` seconds, not counting the CPU of some
    processes of ours (the pool's imports: what they use would otherwise be idle). Reads
    /proc/stat and /proc/<pid>/stat; on a system without them every core counts as spare."""

    def __init__(self, window: float = METER_WINDOW_SECONDS) -> None:
        self.window = window
        self.cpus = os.cpu_count() or 1
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._samples: collections.deque[tuple[float, float, float]] = collections.deque()
        self._own_total = 0.0
        self._own_last: dict[int, float] = {}

    def sample(self, own_pids: list[int]) -> None:
        """Record now's counters; ``own_pids`` are the processes whose CPU counts as idle."""
        busy = self._busy_seconds()
        if busy is None:
            return
        for pid in own_pids:
            used = self._process_seconds(pid)
            if used is None:
                continue
            self._own_total += max(0.0, used - self._own_last.get(pid, used))
            self._own_last[pid] = used
        for pid in [p for p in self._own_last if p not in own_pids]:
            del self._own_last[pid]
        now = time.monotonic()
        self._samples.append((now, busy, self._own_total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()

    def spare(self) -> float:
        """Idle cores over the window (all of them until two samples exist)."""
        if len(self._samples) < 2:
            return float(self.cpus)
        (t0, busy0, own0), (t1, busy1, own1) = self._samples[0], self._samples[-1]
        if t1 - t0 <= 0:
            return float(self.cpus)
        others = max(0.0, (busy1 - busy0) - (own1 - own0))
        return max(0.0, self.cpus - others / (t1 - t0))

    def _busy_seconds(self) -> float | None:
        try:
            with open("/proc/stat", "rb") as fh:
                fields = fh.readline().split()
        except OSError:
            return None
        # cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait is busy.
        values = [int(v) for v in fields[1:9]]
        return (sum(values) - values[3] - values[4]) / self._tick

    def _process_seconds(self, pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        # Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
        rest = data[data.rindex(b")") + 2 :].split()
        return (int(rest[11]) + int(rest[12])) / self._tick


@dataclass
class WarmProcess:
    proc: subprocess.Popen[bytes]
    ready: bool = False
    paused: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid


def close_pipes(warm: WarmProcess) -> None:
    """Closes our ends of its stdin (EOF: an idle warm process exits) and its ready pipe."""
    for pipe in (warm.proc.stdin, warm.proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


class WarmPool:
    def __init__(self, size: int, session_env: dict[str, str], watcher: Watcher, log_path: Path) -> None:
        self.size = max(0, size)
        self._watcher = watcher
        self._log_path = log_path
        self.start_env = dict(session_env)
        self._idle: list[WarmProcess] = []
        self._lock = threading.Lock()
        self._refill_at = 0.0
        self._target = self.size
        self._meter = CpuMeter()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)

    @classmethod
    def for_agent(
        cls, size: int, session_marker: tuple[str, str], watcher: Watcher, data_dir: Path
    ) -> WarmPool:
        # What a cold rank inherits (environment.py): never the agent's secrets, not even idle.
        env = inherited(os.environ)
        env[session_marker[0]] = session_marker[1]
        # As a cold rank would get by default; a rank that asks for more threads gets them at launch.
        env.setdefault("OMP_NUM_THREADS", "1")
        return cls(size, env, watcher, data_dir / "warm-pool.log")

    def start(self) -> None:
        if self.size > 0:
            self._thread.start()

    def hold(self, ranks: int | None = None) -> None:
        """A round of ``ranks`` local ranks is starting on this host: no new import for
        REFILL_DELAY_SECONDS, and from then on aim at ROUNDS_AHEAD rounds' worth of its ranks
        (at most the pool size): its next round (restart, resize) is the likely next launch,
        and an interpreter nobody takes costs memory."""
        with self._lock:
            if ranks is not None:
                self._target = min(self.size, max(1, ranks) * ROUNDS_AHEAD)
            self._refill_at = max(self._refill_at, time.monotonic() + REFILL_DELAY_SECONDS)

    def take(self) -> subprocess.Popen[bytes] | None:
        """An idle warm process, one done importing if there is one (else one still importing:
        it reads its launch line as soon as it is done, still sooner than a cold start), or
        None when the pool is empty."""
        with self._lock:
            self._refill_at = max(self._refill_at, time.monotonic() + REFILL_DELAY_SECONDS)
            self._read_ready()
            for warm in sorted(self._idle, key=lambda w: not w.ready):
                self._idle.remove(warm)
                if warm.proc.poll() is None:
                    if warm.proc.stdout is not None:
                        warm.proc.stdout.close()
                    return warm.proc
                self._discard(warm)
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
        for warm in idle:
            with contextlib.suppress(ProcessLookupError):
                os.kill(warm.pid, signal.SIGCONT)  # a paused process could not see the EOF
            close_pipes(warm)
        deadline = time.monotonic() + CLOSE_WAIT_SECONDS
        for warm in idle:
            with contextlib.suppress(subprocess.TimeoutExpired):
                warm.proc.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(warm.pid, signal.SIGKILL)
            warm.proc.wait()
            self._watcher.forget(warm.pid)

    # --- the refill thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing.wait(POOL_TICK_SECONDS):
            try:
                self._tick()
            except Exception:
                logger.exception("warm pool tick failed")

    def _tick(self) -> None:
        with self._lock:
            for warm in [w for w in self._idle if w.proc.poll() is not None]:
                self._idle.remove(warm)
                self._discard(warm)
            self._read_ready()
            importing = [w for w in self._idle if not w.ready]
            self._meter.sample([w.pid for w in importing])
            spare = self._meter.spare()
            for warm in importing:
                if not warm.paused and spare < PAUSE_BELOW_SPARE_CPUS:
                    self._signal(warm, signal.SIGSTOP)
                elif warm.paused and spare >= MIN_SPARE_CPUS:
                    self._signal(warm, signal.SIGCONT)
            if (
                # As many imports at once as there are idle cores (each keeps one core busy).
                len(importing) + 1 > spare // MIN_SPARE_CPUS
                or len(self._idle) >= self._target
                or time.monotonic() < self._refill_at
            ):
                return
            self._idle.append(self._spawn())

    def _read_ready(self) -> None:
        """Marks processes whose "done importing" byte has arrived. Called with the lock held."""
        for warm in self._idle:
            if warm.ready or warm.proc.stdout is None:
                continue
            try:
                data = os.read(warm.proc.stdout.fileno(), 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                warm.ready = True

    def _signal(self, warm: WarmProcess, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(warm.pid, signum)
        warm.paused = signum == signal.SIGSTOP
        logger.info("warm pool: %s pid %s", "paused" if warm.paused else "resumed", warm.pid)

    def _spawn(self) -> WarmProcess:
        with self._log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.agent.warm", TITLE_PADDING],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.start_env,
                start_new_session=True,
            )
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._watcher.watch(proc.pid)
        logger.info("warm pool: started pid %s (%s idle)", proc.pid, len(self._idle) + 1)
        return WarmProcess(proc)

    def _discard(self, warm: WarmProcess) -> None:
        logger.warning(
            "warm pool: pid %s exited while idle (code %s); see %s",
            warm.pid,
            warm.proc.returncode,
            self._log_path,
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(warm.pid, signal.SIGKILL)
        close_pipes(warm)
        self._watcher.forget(warm.pid)
