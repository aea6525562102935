"""`bin/run`'s supervisor on a fresh home: embedded Redis + SQLite, login works, Ctrl-C leaves no process."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"Trainyard console: (http://\S+)")
STARTED_LINE = re.compile(r"started (\w+) \(pid (\d+)\)")
LOGIN_LINE = re.compile(r"username=(\S+) password=(\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has not collected it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def group_members(pgids: set[int]) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) in pgids and pid_alive(int(entry.name)):
                    members.append(int(entry.name))
            except ProcessLookupError:
                continue
    return members


def processes_of_home(home: Path, wait: float = 10.0) -> list[int]:
    """Live processes started for this console, wherever their session: anything the
    supervisor started passes TRAINYARD_HOME on, including helpers that leave its groups."""
    marker = f"TRAINYARD_HOME={home}".encode()
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0") and pid_alive(int(entry.name)):
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


class Supervisor:
    def __init__(self, process: subprocess.Popen[str], home: Path) -> None:
        self.home = home
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.children: dict[str, int] = {}
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.output.append(line)
            if started := STARTED_LINE.search(line):
                self.children[started.group(1)] = int(started.group(2))
            if match := pattern.search(line):
                return match
        tail = "".join(self.output[-40:])
        raise AssertionError(f"no line matching {pattern.pattern!r} within {timeout}s; output tail:\n{tail}")


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "TRAINYARD_ADMIN_PASSWORD")
    }
    home = tmp_path / "home"
    env.update(TRAINYARD_HOME=str(home), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(free_port())],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sup = Supervisor(process, home)
    try:
        yield sup
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in sup.children.values():
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        for pid in processes_of_home(home, wait=0):
            os.kill(pid, signal.SIGKILL)


def test_run_starts_the_console_and_ctrl_c_stops_every_process(supervisor: Supervisor) -> None:
    # Given a fresh TRAINYARD_HOME and no DATABASE_URL / REDIS_URL
    login = supervisor.wait_for(LOGIN_LINE, timeout=120)
    url = supervisor.wait_for(URL_LINE, timeout=120).group(1)
    username, password = login.group(1), login.group(2)
    assert {"redis", "web", "controller"} <= set(supervisor.children)

    # When the printed admin logs in over HTTP
    http = requests.Session()
    page = http.get(url + "accounts/login/", timeout=10)
    assert page.status_code == 200
    answer = http.post(
        url + "accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"Referer": url + "accounts/login/"},
        timeout=10,
    )
    # Then the dashboard shows
    assert answer.status_code == 200
    assert answer.url == url
    assert 'id="cluster-summary"' in answer.text
    assert "Log out" in answer.text

    # When Ctrl-C reaches the supervisor
    pids = dict(supervisor.children)
    supervisor.process.send_signal(signal.SIGINT)
    supervisor.wait_for(re.compile(r"all processes stopped"), timeout=90)
    assert supervisor.process.wait(timeout=30) == 0

    # Then every process it started, and everything in their process groups, is gone
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert group_members(set(pids.values())) == []
    assert processes_of_home(supervisor.home) == []


def test_a_child_that_dies_stops_everything_and_is_named(supervisor: Supervisor) -> None:
    # Given a running console
    supervisor.wait_for(URL_LINE, timeout=120)
    pids = dict(supervisor.children)

    # When the controller is killed behind the supervisor's back
    os.kill(pids["controller"], signal.SIGKILL)

    # Then the supervisor says which child died, stops the rest and fails
    supervisor.wait_for(re.compile(r"controller \(pid \d+\) exited unexpectedly"), timeout=30)
    supervisor.wait_for(re.compile(r"all processes stopped"), timeout=90)
    assert supervisor.process.wait(timeout=30) != 0
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert group_members(set(pids.values())) == []
    assert processes_of_home(supervisor.home) == []
