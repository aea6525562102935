"""The console served by a real Daphne process against the test database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.support import procs
from tests.support.services import start_web
from workers.net import free_port


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
    process, url = start_web(env, tmp_path / "daphne.log", port)
    try:
        yield url
    finally:
        procs.stop(process, grace=15)
