"""The orphan reaper: a tiny process that outlives a SIGKILLed agent just long enough to kill
its rank process groups.

The agent starts it at boot (``python -m workers.agent.reaper``) with a pipe on its stdin and
writes ``+<pgid>`` when a rank starts and ``-<pgid>`` when the rank's group is gone. Ranks run in
their own sessions, so when the agent dies nothing else would stop them; the pipe reaching EOF
is the one signal that always arrives, whatever killed the agent. On EOF the reaper SIGKILLs
every group it still knows (grandchildren included: they share the group) and exits.

It runs in its own session and ignores SIGINT/SIGTERM/SIGHUP, so a signal aimed at the agent's
terminal or process group cannot take it down before it has done its job.

Two gaps are closed by a second sweep: a rank started in the instant before the agent could
write its ``+<pgid>`` line, and a descendant that left its group (``setsid``). Every rank's
environment carries ENV_AGENT_SESSION, which children inherit; on EOF the reaper also kills
every process whose environment holds this agent's session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

ENV_AGENT_SESSION = "TRAINYARD_AGENT_SESSION"


def processes_of_session(session: str) -> list[int]:
    marker = f"{ENV_AGENT_SESSION}={session}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def run(stream: IO[str], session: str = "") -> None:
    groups: set[int] = set()
    for line in stream:
        line = line.strip()
        if len(line) < 2 or not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if line[0] == "+":
            groups.add(pgid)
        elif line[0] == "-":
            groups.discard(pgid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    if session:
        for pid in processes_of_session(session):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    run(sys.stdin, sys.argv[1] if len(sys.argv) > 1 else "")


class ReaperClient:
    """The agent's end of the pipe. Thread-safe: the supervisor and shutdown both write."""

    def __init__(self, session: str) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "workers.agent.reaper", session],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _write(self, line: str) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        with self._lock:
            if stdin.closed:
                return
            stdin.write(line + "\n")
            stdin.flush()

    def watch(self, pgid: int) -> None:
        self._write(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._write(f"-{pgid}")

    def close(self) -> None:
        """Closes the pipe; the reaper kills whatever it still watches and exits."""
        with self._lock:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    main()
