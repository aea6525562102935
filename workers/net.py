"""Small network helpers shared by the SDK and the PS launcher."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any


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
