"""`bin/run` refuses, with a message saying what to do, to start where it would do harm: on a
home another `bin/run` is using, or when the port its embedded Redis keeps is taken."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_up(home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "manage.py", "up", "--port", "1"],
        cwd=REPO,
        env={**base, "TRAINYARD_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_second_run_on_the_same_home_is_refused(tmp_path: Path) -> None:
    # Given a home whose supervisor lock is held (as a running `bin/run` holds it)
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / "up.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("4242\n")
        lock.flush()

        # When `bin/run` starts on it
        result = run_up(tmp_path)

    # Then it stops at once, names the other one, and started nothing
    assert result.returncode != 0
    assert "another `manage.py up` (bin/run, pid 4242) runs on TRAINYARD_HOME=" in result.stderr
    assert "started" not in result.stdout
    assert not (tmp_path / "postgres" / "data").exists()


def test_a_taken_redis_port_is_named_with_the_way_out(tmp_path: Path) -> None:
    # Given a home whose embedded Redis keeps a port another program now listens on
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        (tmp_path / "redis").mkdir()
        (tmp_path / "redis" / "port").write_text(f"{port}\n")

        # When `bin/run` starts (with a database of its own, so Redis comes first)
        result = run_up(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres")

    # Then it refuses, naming the port, the file and what to do, and leaves nothing running
    assert result.returncode != 0, result.stdout
    saved = tmp_path / "redis" / "port"
    assert (
        f"port {port}, which the embedded Redis keeps in {saved}, is taken by another program"
        in result.stdout
    )
    assert f"delete {saved} to pick a new port" in result.stdout
    assert "all processes stopped" in result.stdout
