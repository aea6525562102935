"""A whole Trainyard console for a chaos run, in the two set-ups the bench compares.

- ``ComposeConsole``: each component its own process, as docker-compose runs them (web, controller,
  ingest, three agents), on a PostgreSQL cluster and a Redis server of the run's own (Redis with
  an append-only file, as in docker-compose.yml). A component SIGKILLed by a fault goes down
  with everything it started (a container's processes die with it) and is started again at once
  (``restart: unless-stopped``).
- ``SupervisedConsole`` (bench/chaos/supervised.py): ``manage.py up`` (what ``bin/run`` starts) with its embedded Redis and
  local agent, plus two more agents started beside it; the database is the run's own cluster
  (``DATABASE_URL``), so it can be restarted. A fault SIGKILLs only the supervisor's child, and
  bringing it back is the supervisor's business. When the supervisor gives up (it stops
  everything when a child dies), the bench starts it again for the next fault, as a user would.

Both expose the same operations: submit a job of the plain script, read its state and round
from the database, find and kill a component, restart Redis or PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import requests

from bench.chaos.infra import MARK, PostgresCluster, kill_tree, port_open, wait_until
from bench.chaos.measure import read_jsonl
from tests.support import procs
from tests.support.agents import agent_argv
from tests.support.controller import controller_argv
from tests.support.services import RedisServer, ingest_argv, web_argv
from workers.net import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "plain_ddp.py"
PYTHON = sys.executable
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_MISSES = 5  # a busy 2-core machine must not make a live agent look lost
WARM_POOL = 2  # per agent; the product default (4) costs three agents' worth of imports at boot
CHECKPOINT_EVERY = 10
STEP_SLEEP = 0.02
AGENT_STOP_GRACE = 40.0
COMPONENTS = ("web", "controller", "ingest")

TOKEN_CODE = """
from django.contrib.auth.models import Group, User
from console.api.models import ApiToken
user, _ = User.objects.get_or_create(username="chaos")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
print(ApiToken.issue(user, "chaos-bench", ["read", "jobs:write", "nodes:write"], replace=True)[1])
"""


@dataclass
class JobRun:
    """A job of the plain script: its id, where its ranks log, the file that ends it."""

    job_id: int
    directory: Path
    every: int = CHECKPOINT_EVERY

    def log_path(self, rank: int) -> Path:
        return self.directory / f"steps-{rank}.jsonl"

    @property
    def finish_file(self) -> Path:
        return self.directory / "finish"

    def finish(self) -> None:
        self.finish_file.touch()

    def records(self, rank: int = 0) -> list[dict[str, Any]]:
        return read_jsonl(self.log_path(rank))

    def rank_logs(self) -> list[list[dict[str, Any]]]:
        return [read_jsonl(path) for path in sorted(self.directory.glob("steps-*.jsonl"))]

    def steps(self, rank: int = 0) -> list[dict[str, Any]]:
        return [r for r in self.records(rank) if r.get("event") is None and "step" in r]

    def rank_pid(self, rank: int) -> int | None:
        """The pid of the newest process that logged as ``rank``."""
        starts = [r for r in self.records(rank) if r.get("event") == "start"]
        return int(starts[-1]["pid"]) if starts else None


class Console:
    """What both set-ups share: the database, the REST API, jobs, agents."""

    kind = ""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self.home = root / "home"
        self.env = {
            **os.environ,
            MARK: run_id,
            "TRAINYARD_HOME": str(self.home),
            "SECRET_KEY": secrets.token_hex(32),
            "TRAINYARD_NODE_TOKEN": secrets.token_urlsafe(24),
            "TRAINYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT_SECONDS),
            "TRAINYARD_HEARTBEAT_MISSES": str(HEARTBEAT_MISSES),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "LOG_LEVEL": "INFO",
        }
        self.env.pop("REDIS_URL", None)
        self.pg = PostgresCluster(root / "postgres", self.env)
        self.env["DATABASE_URL"] = self.pg.url("trainyard")
        self.web_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.web_port}"
        self.token = ""
        self.agent_names: list[str] = []
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.jobs = 0
        self.events: list[str] = []  # what the set-up's own restart policy did, for the cases' notes
        self._job_over: dict[int, tuple[float, bool]] = {}

    # --- database ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def db(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.pg.url("trainyard"), autocommit=True, connect_timeout=5) as conn:
            yield conn

    def query(self, sql: str, params: list[Any] | None = None, attempts: int = 20) -> list[tuple[Any, ...]]:
        """Rows of ``sql``, tried again while the database restarts."""
        for attempt in range(attempts):
            try:
                with self.db() as conn:
                    return list(conn.execute(sql, params or []).fetchall())
            except psycopg.OperationalError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)
        return []

    def job_state(self, job_id: int) -> tuple[str, int]:
        rows = self.query("SELECT state, round_number FROM jobs_job WHERE id = %s", [job_id])
        return (str(rows[0][0]), int(rows[0][1])) if rows else ("MISSING", 0)

    def job_over(self, job_id: int, max_age: float = 1.0) -> bool:
        """The job reached a final state (read at most once per ``max_age`` seconds: loops that
        watch the step log many times a second would otherwise load the database with it)."""
        now = time.monotonic()
        cached = self._job_over.get(job_id)
        if cached is None or now - cached[0] >= max_age:
            cached = (now, self.job_state(job_id)[0] in ("SUCCEEDED", "FAILED", "STOPPED"))
            self._job_over[job_id] = cached
        return cached[1]

    def online(self) -> int:
        rows = self.query(
            "SELECT count(*) FROM cluster_node WHERE state = 'ONLINE' AND name = ANY(%s)", [self.agent_names]
        )
        return int(rows[0][0])

    def node_of_rank(self, job_id: int, node_rank: int) -> str | None:
        rows = self.query(
            "SELECT n.name FROM jobs_allocation a JOIN jobs_round r ON a.round_id = r.id "
            "JOIN cluster_node n ON a.node_id = n.id JOIN jobs_job j ON r.job_id = j.id "
            "WHERE j.id = %s AND r.number = j.round_number AND a.node_rank = %s",
            [job_id, node_rank],
        )
        return str(rows[0][0]) if rows else None

    def wait_online(self, timeout: float = 120.0) -> bool:
        return wait_until(lambda: self.online() == len(self.agent_names), timeout, 0.5)

    # --- set-up helpers ------------------------------------------------------------------------
    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def start_database(self) -> None:
        self.pg.init()
        self.pg.start()
        self.pg.create_database("trainyard")

    def issue_token(self) -> None:
        self.token = self.manage("shell", "-c", TOKEN_CODE).strip().splitlines()[-1]

    def agent_argv(self, name: str, broker: str, checkpoint_root: Path) -> list[str]:
        return agent_argv(
            name,
            broker,
            data_dir=self.root / "agents" / name,
            checkpoint_root=checkpoint_root,
            heartbeat=HEARTBEAT_SECONDS,
            warm_pool=WARM_POOL,
        )

    def spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        """A component in its own session (signals to the bench's terminal do not reach it; the
        bench stops it) that dies with the bench, its output in ``logs/<log>``."""
        return procs.spawn(
            argv,
            cwd=REPO,
            env=self.env,
            log=self.root / "logs" / log,
            stdin=subprocess.DEVNULL,
            die_with_parent=True,
        )

    def start_agent(self, name: str) -> None:
        raise NotImplementedError

    # --- jobs ----------------------------------------------------------------------------------
    def submit(self, tag: str, steps: int = 1_000_000) -> JobRun:
        self.jobs += 1
        directory = self.root / "jobs" / f"{self.jobs:02d}-{tag}"
        directory.mkdir(parents=True)
        run = JobRun(0, directory)
        body = {
            "name": f"chaos-{tag}",
            "entrypoint": str(SCRIPT),
            "workdir": str(SCRIPT.parent),
            "args": [
                "--steps",
                str(steps),
                "--checkpoint-every",
                str(run.every),
                "--step-sleep",
                str(STEP_SLEEP),
                "--step-log",
                str(directory / "steps-{rank}.jsonl"),
                "--finish-file",
                str(run.finish_file),
                "--sdk-metrics",
            ],
            "nnodes": f"2:{len(self.agent_names)}",
            "nproc_per_node": 1,
            "max_restarts": 200,
            "grace_period": 5,
        }
        response = self.http("post", "/api/v1/jobs/", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"job submission failed: {response.status_code} {response.text[:500]}")
        run.job_id = int(response.json()["id"])
        return run

    def stop_job(self, job_id: int) -> None:
        with contextlib.suppress(requests.RequestException):
            self.http("post", f"/api/v1/jobs/{job_id}/stop/")

    def http(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        last: Exception | None = None
        for _ in range(20):
            try:
                return requests.request(
                    method,
                    self.api_url + path,
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=10,
                    **kwargs,
                )
            except requests.ConnectionError as exc:  # the web server may be restarting
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"the API at {self.api_url} does not answer: {last}")

    @property
    def redis_url(self) -> str:
        """The broker every process of the console uses (its telemetry stream too)."""
        raise NotImplementedError

    # --- what faults act on ----------------------------------------------------------------------
    def pid_of(self, component: str) -> int | None:
        raise NotImplementedError

    def kill(self, component: str) -> list[int]:
        """SIGKILL a component (web, controller, ingest or an agent's name) as the set-up does."""
        raise NotImplementedError

    def restart_redis(self, outage: float) -> str:
        """Restarts Redis as the set-up would; says what it did."""
        raise NotImplementedError

    def restart_postgres(self, outage: float) -> None:
        self.pg.restart(outage)

    def problem(self) -> str:
        """Why the console cannot carry on by itself ("" when it can). Called often while a case
        waits; the compose set-up uses the call to restart what exited, as docker would."""
        return ""

    def healthy(self) -> bool:
        """Every component runs and answers, every agent's node is ONLINE."""
        if self.problem() or not port_open(self.web_port):
            return False
        if any(self.pid_of(name) is None for name in self.components_to_watch()):
            return False
        try:
            return self.online() == len(self.agent_names)
        except psycopg.Error:
            return False

    def ensure_running(self) -> list[str]:
        """Brings back what a fault left down for good; returns what it had to restart."""
        return []

    def components_to_watch(self) -> list[str]:
        """What must run for the console to be whole (names pid_of knows)."""
        return [*COMPONENTS, *self.agent_names]

    def owners(self) -> set[int]:
        """Processes that legitimately own processes of the run from outside it."""
        owners = {os.getpid()}
        postmaster = self.pg.postmaster_pid()
        if postmaster:
            owners.add(postmaster)
        return owners

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ComposeConsole(Console):
    """Set-up (a): every component on its own, as docker-compose.yml runs them."""

    kind = "compose"

    def __init__(self, root: Path, run_id: str) -> None:
        super().__init__(root, run_id)
        # An append-only file synced every second, as docker-compose.yml runs Redis.
        self.redis = RedisServer(root / "redis", appendfsync="everysec", env=self.env, die_with_parent=True)
        self.env["REDIS_URL"] = self.redis.url
        self.components: dict[str, subprocess.Popen[bytes]] = {}
        self.agent_names = ["chaos-a", "chaos-b", "chaos-c"]
        self.restarts = 0

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def argv(self, component: str) -> list[str]:
        if component == "web":
            return web_argv(self.web_port)
        if component == "controller":
            return controller_argv(self.home, "controller", self.home / "celerybeat-schedule")
        if component == "ingest":
            return ingest_argv()
        return self.agent_argv(component, self.redis.url, self.root / "checkpoints")

    def start_component(self, name: str) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        popen = self.spawn(self.argv(name), f"{name}.log")
        if name in self.agent_names:
            self.agents[name] = popen
        else:
            self.components[name] = popen

    def start_agent(self, name: str) -> None:
        self.start_component(name)

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.start_database()
        self.redis.start()
        self.manage("migrate", "--noinput")
        self.issue_token()
        for name in (*COMPONENTS, *self.agent_names):
            self.start_component(name)
        if not wait_until(lambda: port_open(self.web_port), 60):
            raise RuntimeError("the web server did not come up; see logs/web.log")
        if not self.wait_online(180):
            raise RuntimeError("the agents did not register; see logs/chaos-*.log")

    def popen(self, component: str) -> subprocess.Popen[bytes] | None:
        return self.agents.get(component) or self.components.get(component)

    def pid_of(self, component: str) -> int | None:
        popen = self.popen(component)
        return popen.pid if popen is not None and popen.poll() is None else None

    def kill(self, component: str) -> list[int]:
        popen = self.popen(component)
        if popen is None:
            return []
        killed = kill_tree(popen.pid)
        procs.kill(popen)  # reaped, and forgotten
        self.restarts += 1
        self.start_component(component)  # restart: unless-stopped
        return killed

    def problem(self) -> str:
        """``restart: unless-stopped``: a component that exited on its own is started again."""
        for name in (*COMPONENTS, *self.agent_names):
            popen = self.popen(name)
            if popen is not None and popen.poll() is not None:
                self.events.append(
                    f"{name} exited by itself (code {popen.returncode}); restarted, as docker would"
                )
                self.start_component(name)
        return ""

    def restart_redis(self, outage: float) -> str:
        self.redis.restart(outage)
        return f"Redis stopped (SIGTERM), {outage:.0f} s down, started on its port"

    def ensure_running(self) -> list[str]:
        restarted = []
        for name in (*COMPONENTS, *self.agent_names):
            if self.pid_of(name) is None:
                self.start_component(name)
                restarted.append(name)
        return restarted

    def close(self) -> None:
        procs.stop_together(list(self.agents.values()), AGENT_STOP_GRACE)
        procs.stop_together(list(self.components.values()), 10)
        self.redis.stop()
        self.pg.stop("fast")
