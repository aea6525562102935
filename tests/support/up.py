"""`manage.py up` (what `bin/run` starts) run by a test as a user would: fresh or kept
TRAINYARD_HOME, DATABASE_URL and REDIS_URL unset (so the embedded PostgreSQL and Redis are used),
its output read line by line, its REST API called over HTTP, and every process it started found
by pid afterwards.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.support import procs
from workers.cli import token_from_password
from workers.net import free_port

REPO = Path(__file__).resolve().parents[2]
URL_LINE = re.compile(r"Trainyard console: (http://\S+)")
STARTED_LINE = re.compile(r"(?:re)?started (\w+) \(pid (\d+)\)")
LOGIN_LINE = re.compile(r"username=(\S+) password=(\S+)")
BROKER_LINE = re.compile(r"broker: redis://(?::\*\*\*@)?127\.0\.0\.1:(\d+)/0")
POSTGRES_LINE = re.compile(r"PostgreSQL ready on 127\.0\.0\.1:(\d+)")
STOPPED_LINE = re.compile(r"all processes stopped")
AGENT_COMMAND_LINE = re.compile(r"^  (TRAINYARD_NODE_TOKEN=.+ -m workers\.agent .*)$")
BOOT_TIMEOUT = 240.0
"""Seconds for a console to come up: initdb, migrations and five processes importing Django or
torch on two cores shared with the rest of the suite."""


def processes_of_home(home: Path, wait: float = 10.0) -> list[int]:
    """Live processes started for this console, wherever their session: everything the
    supervisor starts (PostgreSQL and Redis too) has TRAINYARD_HOME in its environment."""
    marker = f"TRAINYARD_HOME={home}".encode()
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0") and procs.alive(int(entry.name)):
                    found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


class RunningConsole:
    """One `manage.py up` process and what it printed."""

    def __init__(self, home: Path, port: int, *extra: str) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "REDIS_URL", "TRAINYARD_ADMIN_PASSWORD", "TRAINYARD_NODE_TOKEN")
        }
        env.update(TRAINYARD_HOME=str(home), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.home = home
        self.process = procs.spawn(
            [sys.executable, "manage.py", "up", "--port", str(port), *extra],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.children: dict[str, int] = {}  # name -> latest pid
        self.started: dict[int, float] = {}  # every pid it started -> its start time
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
        """The next line matching ``pattern``; lines on the way are kept in ``output``."""
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
                pid = int(started.group(2))
                self.children[started.group(1)] = pid
                with contextlib.suppress(psutil.Error):
                    self.started[pid] = psutil.Process(pid).create_time()
            if match := pattern.search(line):
                return match
        raise AssertionError(
            f"no line matching {pattern.pattern!r} within {timeout:.0f} s; output tail:\n{self.tail()}"
        )

    def seen(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        """The last line already read that matches ``pattern``."""
        for line in reversed(self.output):
            if match := pattern.search(line):
                return match
        return None

    def tail(self, lines: int = 60) -> str:
        return "".join(self.output[-lines:])

    def leftovers(self) -> list[int]:
        """Processes it started, or anything else of this home, still alive."""
        left = {pid for pid, created in self.started.items() if procs.alive(pid, created)}
        return sorted(left | set(processes_of_home(self.home)))

    def remember_descendants(self) -> None:
        """Notes every process below the supervisor now (PostgreSQL's backends, Celery's
        workers...): PostgreSQL and Redis rewrite their environment for their process titles,
        so ``processes_of_home`` cannot find them afterwards."""
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.started[proc.pid] = proc.create_time()

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops `bin/run`; its exit code once it has stopped everything."""
        self.remember_descendants()
        self.process.send_signal(signal.SIGINT)
        self.wait_for(STOPPED_LINE, timeout=120)
        return self.process.wait(timeout=30)

    def kill_everything(self) -> None:
        """Teardown after a failure: nothing of this console may outlive the test."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=90)
        procs.kill(self.process)
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class ConsoleApi:
    """The REST API as a script would use it: a token minted with the printed admin login."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url.rstrip("/")
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token_from_password(self.url, username, password)}"

    def get(self, path: str) -> Any:
        response = self.http.get(f"{self.url}/api/v1/{path}", timeout=30)
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
        return response.json()

    def submit(self, spec: dict[str, Any]) -> int:
        response = self.http.post(f"{self.url}/api/v1/jobs/", json=spec, timeout=30)
        assert response.status_code == 201, response.text[:1000]
        job_id: int = response.json()["id"]
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.get(f"jobs/{job_id}/")
        return job

    def nodes_of(self, job_id: int) -> set[str]:
        """Every node any round of the job ran on."""
        return {a["node"] for r in self.job(job_id)["rounds"] for a in r["allocations"]}

    def wait_node_online(self, name: str, timeout: float = BOOT_TIMEOUT) -> None:
        self.wait_node_state(name, {"ONLINE"}, timeout)

    def wait_heartbeat_after(self, name: str, moment: datetime, timeout: float = 120.0) -> None:
        """Until node ``name`` is ONLINE with a heartbeat later than ``moment``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.get("nodes/")["results"]:
                beat = node["last_heartbeat"]
                if (
                    node["name"] == name
                    and node["state"] == "ONLINE"
                    and beat
                    and datetime.fromisoformat(beat.replace("Z", "+00:00")) > moment
                ):
                    return
            time.sleep(0.5)
        raise AssertionError(f"no heartbeat of {name} since {moment} within {timeout:.0f} s")

    def wait_node_state(self, name: str, states: set[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(n["name"] == name and n["state"] in states for n in self.get("nodes/")["results"]):
                return
            time.sleep(0.5)
        raise AssertionError(f"node {name} not in {states} within {timeout:.0f} s: {self.get('nodes/')}")

    def wait_job(self, job_id: int, states: set[str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            assert job["state"] not in {"FAILED", "STOPPED"} - states, job
            time.sleep(0.5)
        events = self.get(f"jobs/{job_id}/events/")
        raise AssertionError(f"job {job_id} not in {states} within {timeout:.0f} s: {job}\nevents: {events}")


def digits_job(name: str, steps: int = 20) -> dict[str, Any]:
    """The built-in digits workload, one rank, a few steps: a whole job in seconds."""
    return {
        "name": name,
        "workload": "digits-mlp",
        "nnodes": "1",
        "nproc_per_node": 1,
        "hyperparameters": {"steps": steps, "log_every": 5},
    }


@pytest.fixture
def consoles() -> Iterator[list[RunningConsole]]:
    """Consoles a test starts (append them); all are torn down, whatever happened."""
    started: list[RunningConsole] = []
    try:
        yield started
    finally:
        for console in reversed(started):
            console.kill_everything()


def start_console(started: list[RunningConsole], home: Path) -> tuple[RunningConsole, str]:
    """A console on ``home`` and a free port, once it prints its URL. Its agent starts ranks
    cold: a warm interpreter still importing torch at nice 19 crawls on this shared machine."""
    console = RunningConsole(home, free_port(), "--warm-pool", "0")
    started.append(console)
    url = console.wait_for(URL_LINE, timeout=BOOT_TIMEOUT).group(1)
    return console, url


def secrets_on_command_lines(home: Path, *extra_pids: int) -> list[str]:
    """Processes of this console (and ``extra_pids`` and their children) whose command line holds
    one of the home's secrets (the Redis and PostgreSQL passwords, the node token, the secret
    key): `ps` shows command lines to every local user."""
    kept = [
        home / "redis" / "password",
        home / "postgres" / "password",
        home / "node_token",
        home / "secret_key",
    ]
    values = [path.read_text().strip() for path in kept if path.exists()]
    assert values, f"no secrets found under {home}"
    pids = set(processes_of_home(home, wait=0))
    for pid in extra_pids:
        with contextlib.suppress(psutil.Error):
            pids |= {pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))}
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            argv = " ".join(psutil.Process(pid).cmdline())
            found += [f"{pid}: {argv[:120]}" for value in values if value and value in argv]
    return found
