"""A live console for browser tests: Daphne (console_url) plus a controller, an ingest process and
room for agents, all stopped in teardown."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.support import procs
from tests.support.agents import AgentProcs
from tests.support.controller import REPO, Controller, service_env, wait_for
from tests.support.services import ingest_argv

HEARTBEAT = 1.0


@dataclass
class LiveConsole:
    url: str
    agents: AgentProcs
    root: Path
    controller: Controller

    def start_agents(self, *names: str) -> None:
        from console.cluster.models import Node

        for name in names:
            self.agents.start(name, heartbeat=HEARTBEAT)
        wait_for(
            lambda: Node.objects.filter(name__in=names, state="ONLINE").count() == len(names),
            timeout=60,
            message=f"agents {names} to register",
        )


@pytest.fixture
def live_console(console_url: str, tmp_path: Path) -> Iterator[LiveConsole]:
    """The console at console_url plus a controller (bundle URLs point at it), an ingest
    process and room for agents; all stopped in teardown."""
    url = settings.REDIS_URL
    redis.Redis.from_url(url).flushdb()
    controller = Controller(
        url,
        tmp_path / "controller",
        TRAINYARD_HEARTBEAT_INTERVAL=str(HEARTBEAT),
        TRAINYARD_HEARTBEAT_MISSES="5",
        TRAINYARD_CONTROLLER_TICK="0.5",
        TRAINYARD_PUBLIC_URL=console_url,
    )
    ingest = procs.spawn(
        ingest_argv("browser-live"),
        cwd=REPO,
        env=service_env(url, tmp_path / "ingest"),
        log=tmp_path / "ingest.log",
    )
    # No warm pool: a warm interpreter handed to a round while still importing keeps nice 19
    # until it is ready, and on a loaded machine that starved the first round for minutes.
    agents = AgentProcs(tmp_path, url, token=settings.NODE_TOKEN, warm_pool=0)
    controller.start()
    try:
        yield LiveConsole(console_url, agents, tmp_path, controller)
    finally:
        agents.cleanup()
        controller.kill()  # its state is in PostgreSQL: nothing to wind down at the end of a test
        procs.stop(ingest, grace=15)
        redis.Redis.from_url(url).flushdb()
