"""`bin/run` on a fresh home and again on the same home: the embedded PostgreSQL and Redis,
a job to SUCCEEDED on the local agent, Ctrl-C leaving no process (PostgreSQL and Redis
included), and a second run keeping the job, the admin and the Redis port, so that an agent
started by hand with the printed command line reconnects by itself."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from tests.support import procs
from tests.support.up import (
    AGENT_COMMAND_LINE,
    BROKER_LINE,
    LOGIN_LINE,
    POSTGRES_LINE,
    ConsoleApi,
    RunningConsole,
    digits_job,
    secrets_on_command_lines,
    start_console,
)

JOB_TIMEOUT = 240.0
EVERY_CHILD = {"postgres", "redis", "web", "controller", "ingest", "agent"}


def stop_and_check_nothing_is_left(console: RunningConsole) -> None:
    pids = dict(console.children)
    assert console.interrupt() == 0
    assert [name for name, pid in pids.items() if pid in console.leftovers()] == []
    assert console.leftovers() == []


def start_printed_agent(console: RunningConsole, log: Path) -> subprocess.Popen[bytes]:
    """The extra agent's command line as the console printed it, pasted into a shell (with no
    warm pool: its imports would only slow this shared machine down)."""
    printed = console.seen(AGENT_COMMAND_LINE)
    assert printed is not None, console.tail()
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINYARD_NODE_TOKEN", "REDIS_URL")}
    return procs.spawn(["bash", "-c", f"{printed.group(1)} --warm-pool 0"], env=env, log=log)


def test_second_run_keeps_jobs_admin_and_redis_port(tmp_path: Path, consoles: list[RunningConsole]) -> None:
    home = tmp_path / "home"

    # Given a first `bin/run` on an empty home, with no DATABASE_URL or REDIS_URL
    first, url = start_console(consoles, home)
    assert set(first.children) >= EVERY_CHILD
    login = first.seen(LOGIN_LINE)
    assert login is not None, first.tail()
    username, password = login.group(1), login.group(2)
    broker_port = first.seen(BROKER_LINE)
    postgres_port = first.seen(POSTGRES_LINE)
    assert broker_port and postgres_port
    assert (home / "postgres" / "data" / "PG_VERSION").exists()

    # When a digits job is submitted through the REST API
    api = ConsoleApi(url, username, password)
    api.wait_node_online("local")
    job_id = api.submit(digits_job("before-restart"))

    # Then it runs on the local agent to SUCCEEDED
    api.wait_job(job_id, {"SUCCEEDED"}, JOB_TIMEOUT)
    assert api.nodes_of(job_id) == {"local"}

    # And an agent started by hand with the printed command line registers
    extra = start_printed_agent(first, tmp_path / "agent-2.log")
    try:
        api.wait_node_online("agent-2")

        # And no process it started (nor that agent, nor their children) has a secret on its
        # command line: the Redis password, the database's, the node token
        assert secrets_on_command_lines(home, extra.pid) == []

        # When Ctrl-C reaches the supervisor, then every process it started is gone
        stop_and_check_nothing_is_left(first)

        # When `bin/run` starts again on the same home
        restarted_at = datetime.now(UTC)
        second, url = start_console(consoles, home)
        assert set(second.children) >= EVERY_CHILD

        # Then the admin, the job and both ports were kept (no new login is printed)
        assert second.seen(LOGIN_LINE) is None
        assert second.seen(re.compile(r"Admin 'admin' already exists")) is not None
        assert second.seen(BROKER_LINE).group(1) == broker_port.group(1)  # type: ignore[union-attr]
        assert second.seen(POSTGRES_LINE).group(1) == postgres_port.group(1)  # type: ignore[union-attr]
        api = ConsoleApi(url, username, password)
        assert api.job(job_id)["state"] == "SUCCEEDED"

        # And the agent started by hand, left running, reconnected by itself
        assert extra.poll() is None
        api.wait_heartbeat_after("agent-2", restarted_at)
    finally:
        procs.stop(extra, grace=30)
    api.wait_node_state("agent-2", {"OFFLINE", "LOST"})

    # And a job submitted now runs on the local agent to SUCCEEDED
    api.wait_node_online("local")
    again = api.submit(digits_job("after-restart"))
    api.wait_job(again, {"SUCCEEDED"}, JOB_TIMEOUT)
    assert api.nodes_of(again) == {"local"}

    stop_and_check_nothing_is_left(second)
