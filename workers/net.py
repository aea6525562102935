"""Small network helpers shared by the SDK, the PS launcher, the tests and the benches: the one
``free_port`` and the one ``wait_listening``."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the kernel's pick). Someone else may take it before
    it is bound again: fine for tests, benches and processes started on this host at once."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_listening(
    host: str,
    port: int,
    timeout: float,
    *,
    poll: float = 0.05,
    process: subprocess.Popen[Any] | None = None,
) -> None:
    """Returns once ``host:port`` accepts a TCP connection, polling every ``poll`` seconds.

    TimeoutError after ``timeout``; RuntimeError as soon as ``process`` (the one that should
    listen there) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(0.5, timeout))):
                return
        except OSError as error:
            if process is not None and process.poll() is not None:
                raise RuntimeError(
                    f"the process for {host}:{port} exited with {process.returncode}"
                ) from None
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{host}:{port} is not listening after {timeout:g} s: {error}") from None
            time.sleep(poll)
