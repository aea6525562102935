"""The console served by a real Daphne process against the test database."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.support import procs

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def console_url(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """Daphne on a free port, reading and writing the test database."""
    db = settings.DATABASES["default"]
    port = free_port()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        TRAINYARD_HOME=str(settings.TRAINYARD_HOME),
        # Rounds started by a request (a resize) hand agents bundle URLs on this console.
        TRAINYARD_PUBLIC_URL=f"http://127.0.0.1:{port}",
        PYTHONUNBUFFERED="1",
    )
    log_path = tmp_path / "daphne.log"
    process = procs.spawn(
        [
            str(Path(sys.executable).parent / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "console.asgi:application",
        ],
        cwd=REPO,
        env=env,
        log=log_path,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "daphne did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(process, grace=15)
