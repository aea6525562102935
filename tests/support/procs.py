"""Processes started by test fixtures and benches, and stopping every one of them: on SIGTERM,
SIGINT, an exception and the interpreter's exit, nothing started here is left running.

    popen = procs.spawn([...], log=path, env=env)   # own session, registered
    procs.stop(popen)                              # its group: SIGTERM, grace, SIGKILL; and every
                                                   # descendant seen, by pid (ranks in sessions of
                                                   # their own too)

    with procs.stopped_on_exit():                  # a bench's main(): SIGTERM and SIGINT unwind
        run_the_bench()                            # like Ctrl-C; whatever is still registered at
                                                   # the end is stopped, even mid-start-up

The test suite installs the same signal handling (tests/conftest.py), so pytest tears its
fixtures down on SIGTERM as it does on Ctrl-C, and stops what is left when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

DEFAULT_GRACE = 10.0


@dataclass
class _Tracked:
    popen: subprocess.Popen[Any]
    created: float
    # Every descendant seen, by pid with its start time (a reused pid is not ours).
    seen: dict[int, float] = field(default_factory=dict)

    def remember(self) -> None:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.popen.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.seen[proc.pid] = proc.create_time()


_registry: dict[int, _Tracked] = {}
_cleaning = 0


def alive(pid: int, created: float | None = None) -> bool:
    """True while ``pid`` runs (a zombie has exited; a pid reused since ``created`` is not it)."""
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 0.5:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def spawn(
    argv: list[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    die_with_parent: bool = False,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Starts ``argv`` in a session of its own (so its group can be signalled as a whole) and
    registers it. Output goes to ``log`` (appended) unless ``stdout`` is given.

    ``die_with_parent``: the child gets SIGKILL when the thread that started it ends, even when
    this process is SIGKILLed (Linux's parent-death signal; start it from the main thread)."""
    if die_with_parent:
        popen.setdefault("preexec_fn", _die_with_parent)
    out = log.open("ab") if log is not None else None
    if out is not None:
        popen.setdefault("stdout", out)
        popen.setdefault("stderr", subprocess.STDOUT)
    try:
        process: subprocess.Popen[Any] = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True, **popen
        )
    finally:
        if out is not None:
            out.close()
    return adopt(process)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL when its parent dies."""
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def adopt(process: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    """Registers a process started elsewhere, so it is stopped with the rest."""
    try:
        created = psutil.Process(process.pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    _registry[process.pid] = _Tracked(process, created)
    return process


def remember_descendants(process: subprocess.Popen[Any]) -> None:
    """Notes the process's current descendants, so they are stopped even once reparented."""
    if tracked := _registry.get(process.pid):
        tracked.remember()


def known_descendants(process: subprocess.Popen[Any]) -> dict[int, float]:
    tracked = _registry.get(process.pid)
    return dict(tracked.seen) if tracked else {}


def _signal(tracked: _Tracked, sig: int) -> None:
    """``sig`` to the process and its group. A pid reused by someone else's process is left
    alone; a group whose leader is gone still gets it (the kernel does not hand out a pid that
    a live group still uses)."""
    pid = tracked.popen.pid
    if not tracked.created and tracked.popen.returncode is not None:
        return  # reaped, and never registered: its pid may be anyone's by now
    with contextlib.suppress(psutil.Error):
        if tracked.created and abs(psutil.Process(pid).create_time() - tracked.created) > 0.5:
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    if tracked.popen.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(
    process: subprocess.Popen[Any], grace: float = DEFAULT_GRACE, sig: int = signal.SIGTERM
) -> int | None:
    """``sig`` to the process's group, up to ``grace`` seconds for it to exit, then SIGKILL to
    the group and to every descendant ever seen. Returns the exit code."""
    tracked = _registry.get(process.pid) or _Tracked(process, 0.0)
    with shielded():
        tracked.remember()
        if process.poll() is None and grace > 0:
            _signal(tracked, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
        tracked.remember()
        _signal(tracked, signal.SIGKILL)
        for pid, created in tracked.seen.items():
            if alive(pid, created):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p, c) for p, c in tracked.seen.items()):
            time.sleep(0.05)
        _registry.pop(process.pid, None)
    return process.returncode


def stop_together(processes: list[subprocess.Popen[Any]], grace: float = DEFAULT_GRACE) -> None:
    """Like ``stop`` for each, but ``sig`` reaches them all at once and they share one grace
    period (three agents draining their ranks: one grace, not three)."""
    with shielded():
        for process in processes:
            tracked = _registry.get(process.pid) or _Tracked(process, 0.0)
            tracked.remember()
            if process.poll() is None:
                _signal(tracked, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for process in processes:
            stop(process, grace=0)


def kill(process: subprocess.Popen[Any]) -> int | None:
    """SIGKILL at once, to the process's group and every descendant seen."""
    return stop(process, grace=0)


def running() -> list[subprocess.Popen[Any]]:
    return [t.popen for t in _registry.values() if t.popen.poll() is None]


def stop_all(grace: float = DEFAULT_GRACE) -> None:
    """Stops everything still registered, the latest started first."""
    for tracked in reversed(list(_registry.values())):
        stop(tracked.popen, grace)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """While stopping processes (or cleaning up after them), a further SIGTERM or Ctrl-C does not
    cut the stopping short."""
    global _cleaning
    _cleaning += 1
    try:
        yield
    finally:
        _cleaning -= 1


_running_at_signal: int | None = None


def _unwind(signum: int, frame: FrameType | None) -> None:
    global _running_at_signal
    if _cleaning:
        return
    _running_at_signal = len(running())
    raise KeyboardInterrupt(f"got {signal.Signals(signum).name}")


def unwind_on_signals() -> None:
    """SIGTERM (and SIGINT) raise KeyboardInterrupt in the main thread, so ``finally`` blocks and
    fixture teardowns run, as they do on Ctrl-C; not while processes are being stopped."""
    signal.signal(signal.SIGTERM, _unwind)
    signal.signal(signal.SIGINT, _unwind)


@contextlib.contextmanager
def stopped_on_exit(grace: float = DEFAULT_GRACE) -> Iterator[None]:
    """A bench's main body: signals unwind it, and everything started is stopped at the end.
    Interrupted, it says so in one line (no traceback) and exits with 130, as after Ctrl-C."""
    unwind_on_signals()
    try:
        yield
    except KeyboardInterrupt as exc:
        # (the bench's own clean-up may have stopped some while the interrupt unwound it)
        seen = _running_at_signal if _running_at_signal is not None else len(running())
        stop_all(grace)
        print(
            f"interrupted ({exc or 'Ctrl-C'}): the {seen} processes running then are stopped", file=sys.stderr
        )
        raise SystemExit(130) from None
    finally:
        stop_all(grace)


# Whatever a failure left registered (a fixture or bench that raised mid-start-up, before its
# own cleanup was set up) is stopped when the interpreter exits.
atexit.register(stop_all, 5.0)
