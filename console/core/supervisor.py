"""Keeps the one-machine console's processes running: starts each in its own process group,
restarts one that dies with a growing delay, gives up (so everything is stopped) only when a
child keeps crashing, and stops them all in reverse start order.

Deciding is kept apart from doing: ``CrashPolicy`` turns a child's recent crash times into "wait
this long" or "give up" and touches no process; ``Supervisor`` acts on it. ``manage.py up``
(console/core/management/commands/up.py) says what to run and in which order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

_PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


class Output(Protocol):
    """Where the supervisor reports (a management command's stdout, or any text stream)."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


@dataclass(frozen=True)
class CrashPolicy:
    """How soon a crashed child is started again: ``first_delay`` after its first crash,
    doubling with each further crash within ``window`` seconds (at most ``max_delay``); the
    ``limit``-th crash within the window means it cannot run here, and the supervisor gives up.
    """

    limit: int = 5
    window: float = 60.0
    first_delay: float = 1.0
    max_delay: float = 15.0

    def delay(self, crashes: list[float], now: float) -> float | None:
        """Seconds to wait before the next start, or None to give up. ``crashes`` are the
        child's crash times (monotonic), this one included."""
        recent = [t for t in crashes if now - t <= self.window]
        if len(recent) >= self.limit:
            return None
        return min(self.first_delay * 2 ** (len(recent) - 1), self.max_delay)


@dataclass(frozen=True)
class ChildSpec:
    """What to run. ``argv`` may be a function: it is called at each (re)start."""

    name: str
    argv: list[str] | Callable[[], list[str]]
    stop_signal: signal.Signals = signal.SIGTERM
    grace: float = 10.0
    user: str | None = None  # run as this system user (PostgreSQL refuses root)
    log: Path | None = None  # output to this file instead of the supervisor's

    def command(self) -> list[str]:
        return self.argv() if callable(self.argv) else list(self.argv)


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    crashes: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    restart_at: float | None = None  # set while waiting out a crash's delay
    starts: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class GaveUp(Exception):
    """A child crashed too often: the console cannot run as configured."""


def _child_setup(death_signal: int) -> Callable[[], None]:
    def setup() -> None:
        """Between fork and exec: die with the supervisor. The parent-death signal covers a
        supervisor that is itself SIGKILLed, which no handler of ours can see. (The new
        session comes from ``start_new_session``, before any user switch.)"""
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, death_signal)

    return setup


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervisor:
    def __init__(
        self,
        out: Output,
        env: dict[str, str],
        cwd: Path,
        policy: CrashPolicy | None = None,
    ) -> None:
        self.out = out
        self.env = env
        self.cwd = cwd
        self.policy = policy or CrashPolicy()
        self.children: list[Child] = []
        self.stopping = False

    def say(self, text: str) -> None:
        self.out.write(f"[trainyard] {text}\n")
        self.out.flush()

    def start(self, spec: ChildSpec) -> Child:
        child = Child(spec=spec)
        self.children.append(child)
        self._spawn(child)
        return child

    def _spawn(self, child: Child) -> None:
        spec = child.spec
        argv = spec.command()
        log = spec.log.open("ab") if spec.log else None
        try:
            child.process = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,  # its own group: a signal reaches its workers too
                preexec_fn=_child_setup(spec.stop_signal),
                user=spec.user,
                group=spec.user,
                extra_groups=[] if spec.user else None,
            )
        finally:
            if log:
                log.close()
        child.starts += 1
        child.restart_at = None
        verb = "started" if child.starts == 1 else "restarted"
        self.say(f"{verb} {child.name} (pid {child.pid}): {' '.join(argv)}")

    def check(self, now: float | None = None) -> None:
        """One pass of the watch loop: notices children that died, schedules their restart,
        restarts those whose delay is over. Raises GaveUp for a child that keeps crashing."""
        now = time.monotonic() if now is None else now
        for child in self.children:
            if self.stopping:
                return
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._spawn(child)
                continue
            if child.process is None or child.process.poll() is None:
                continue
            code = child.process.returncode
            # Whatever the dead child left in its group (workers it forked) goes too, so the
            # new one starts clean (PostgreSQL refuses to start beside its old backends).
            signal_group(child.process.pid, signal.SIGKILL)
            child.crashes.append(now)
            delay = self.policy.delay(list(child.crashes), now)
            if delay is None:
                raise GaveUp(
                    f"{child.name} (pid {child.pid}) exited with {describe_exit(code)}: "
                    f"{self.policy.limit} crashes within {self.policy.window:.0f} s; giving up"
                )
            child.restart_at = now + delay
            self.say(
                f"{child.name} (pid {child.pid}) exited unexpectedly with {describe_exit(code)}; "
                f"restarting it in {delay:.0f} s"
            )

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def stop_all(self) -> None:
        """Stops children in reverse start order (the agent first, PostgreSQL last)."""
        for child in reversed(self.children):
            self.stop(child)

    def stop(self, child: Child) -> None:
        child.restart_at = None
        process = child.process
        if process is None:
            return
        if process.poll() is None:
            self.say(f"stopping {child.name} (pid {process.pid})")
            signal_group(process.pid, child.spec.stop_signal)
            try:
                process.wait(timeout=child.spec.grace)
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop within {child.spec.grace:.0f} s; killing it")
        # Whatever is left in the group (workers the child forked) goes too.
        signal_group(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=10)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"code {code}"
