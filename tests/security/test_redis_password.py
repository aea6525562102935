"""bin/run's Redis has a password: any local user could otherwise write to the broker (and,
before commands were sealed, run anything on the agent as its user).

The password is made on first use under $TRAINYARD_HOME/redis (mode 0600) and reaches
redis-server in a private config file, never on its command line, where `ps` shows it to every
local user.
"""

from __future__ import annotations

import stat
import time
from io import StringIO
from pathlib import Path

import psutil
import pytest
import redis

from console.core.embedded import EmbeddedRedis, broker_url, redis_server_binary
from console.core.supervisor import ChildSpec, CrashPolicy, Supervisor


def test_the_embedded_redis_refuses_clients_without_its_password(tmp_path: Path) -> None:
    binary = redis_server_binary()
    assert binary is not None
    server = EmbeddedRedis(tmp_path, binary)
    sup = Supervisor(
        StringIO(), {}, tmp_path, CrashPolicy(limit=1, window=30.0, first_delay=0.2, max_delay=1.0)
    )
    try:
        child = sup.start(ChildSpec("redis", server.argv, log=server.log))
        deadline = time.monotonic() + 20
        while not server.accepting():
            sup.check()
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)

        # When a local user without the password writes a command to an agent's queue
        intruder = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            intruder.lpush("node.local", "a start_round message")
        intruder.close()

        # Then it is refused; the console's URL (with the password) works
        console = redis.Redis.from_url(broker_url(tmp_path))
        assert console.lpush("node.local", "x") == 1
        console.close()

        # And the password is on no command line, and kept readable by its owner only
        assert child.pid is not None
        argv = " ".join(psutil.Process(child.pid).cmdline())
        assert server.password not in argv
        for name in ("password", "redis.conf"):
            assert stat.S_IMODE((server.root / name).stat().st_mode) == 0o600
    finally:
        sup.stop_all()
