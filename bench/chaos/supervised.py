"""Set-up (b) of the chaos bench: ``manage.py up`` (what ``bin/run`` starts) with its embedded
Redis and local agent, plus two more agents started beside it; the database is the run's own
cluster (``DATABASE_URL``), so it can be restarted. A fault SIGKILLs only the supervisor's
child, and bringing it back is the supervisor's business. When the supervisor gives up (it
stops everything when a child dies), the bench starts it again for the next fault, as a user
would."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import psutil

from bench.chaos.console import AGENT_STOP_GRACE, COMPONENTS, PYTHON, Console
from bench.chaos.infra import port_open, signal_pid, wait_until
from tests.support import procs


class SupervisedConsole(Console):
    """Set-up (b): ``manage.py up`` (bin/run's supervisor) and two more agents beside it."""

    kind = "supervised"
    LOCAL_AGENT = "local"

    def __init__(self, root: Path, run_id: str) -> None:
        super().__init__(root, run_id)
        # Named so that placement (by node name) puts the supervisor's own agent last: it is the
        # non-rank-0 agent the agent fault kills, and the supervisor has to bring it back.
        self.extra_names = ["a-extra", "b-extra"]
        self.agent_names = [*self.extra_names, self.LOCAL_AGENT]
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.supervisor_starts = 0
        self.broker = ""

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.start_database()
        self.start_supervisor()
        self.issue_token()

    def start_supervisor(self) -> None:
        self.supervisor_starts += 1
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.supervisor = self.spawn(
            [PYTHON, "manage.py", "up", "--port", str(self.web_port)],
            f"supervisor-{self.supervisor_starts}.log",
        )
        if not wait_until(lambda: port_open(self.web_port) or self.supervisor_exited(), 120):
            raise RuntimeError("manage.py up did not bring the web server up")
        if self.supervisor_exited():
            raise RuntimeError("manage.py up exited during start-up; see logs/supervisor-*.log")
        broker = self.embedded_broker()
        if broker != self.broker:
            # A new Redis port (today's supervisor picks a free one each start): agents started
            # against the old one can never reconnect, so they are started again.
            procs.stop_together(list(self.agents.values()), AGENT_STOP_GRACE)
            self.agents.clear()
            self.broker = broker
        for name in self.extra_names:
            if self.pid_of(name) is None:
                self.start_agent(name)
        if not self.wait_online(180):
            raise RuntimeError("the agents did not register")

    @property
    def redis_url(self) -> str:
        return self.broker

    def embedded_broker(self) -> str:
        """The broker URL of the supervisor's Redis (from its command line), or REDIS_URL."""
        if "REDIS_URL" in self.env:
            return self.env["REDIS_URL"]
        found = wait_until(lambda: self.child("redis-server") is not None, 30)
        proc = self.child("redis-server") if found else None
        if proc is None:
            raise RuntimeError("the supervisor started no Redis")
        # redis-server retitles itself "redis-server 127.0.0.1:PORT"; its listening socket says it too.
        ports = sorted({c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == "LISTEN"})
        if not ports:
            raise RuntimeError("the supervisor's Redis listens on no port")
        return f"redis://127.0.0.1:{ports[0]}/0"

    def start_agent(self, name: str) -> None:
        self.agents[name] = self.spawn(
            self.agent_argv(name, self.broker, self.home / "checkpoints"), f"{name}.log"
        )

    def supervisor_exited(self) -> bool:
        return self.supervisor is None or self.supervisor.poll() is not None

    def child(self, needle: str) -> psutil.Process | None:
        """The supervisor's child whose command line contains ``needle``."""
        if self.supervisor_exited():
            return None
        assert self.supervisor is not None
        try:
            children = psutil.Process(self.supervisor.pid).children()
        except psutil.Error:
            return None
        for proc in children:
            with contextlib.suppress(psutil.Error):
                if needle in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
        return None

    NEEDLES = {
        "web": "console.webserver",
        "controller": "-Q control",
        "ingest": "manage.py ingest",
        "redis": "redis-server",
        LOCAL_AGENT: "--name local",
    }

    def pid_of(self, component: str) -> int | None:
        if component in self.extra_names:
            popen = self.agents.get(component)
            return popen.pid if popen is not None and popen.poll() is None else None
        proc = self.child(self.NEEDLES[component])
        return proc.pid if proc is not None else None

    def components_to_watch(self) -> list[str]:
        return [*COMPONENTS, "redis", *self.agent_names]

    def kill(self, component: str) -> list[int]:
        pid = self.pid_of(component)
        if pid is None:
            return []
        signal_pid(pid, signal.SIGKILL)
        return [pid]

    def restart_redis(self, outage: float) -> str:
        """SIGTERM to the embedded Redis: it saves and exits; restarting it is the supervisor's
        job. ``outage`` is not used: the supervisor decides when it comes back."""
        pid = self.pid_of("redis")
        if pid is not None:
            signal_pid(pid, signal.SIGTERM)
        return f"SIGTERM to the supervisor's Redis (pid {pid}); restarting it is the supervisor's job"

    def problem(self) -> str:
        if self.supervisor_exited():
            assert self.supervisor is not None
            return f"manage.py up exited (code {self.supervisor.returncode}) and stopped every process"
        return ""

    def ensure_running(self) -> list[str]:
        if not self.supervisor_exited():
            return []
        self.start_supervisor()
        return ["manage.py up"]

    def owners(self) -> set[int]:
        owners = super().owners()
        if self.supervisor is not None and not self.supervisor_exited():
            owners.add(self.supervisor.pid)
        return owners

    def close(self) -> None:
        procs.stop_together(list(self.agents.values()), AGENT_STOP_GRACE)
        if self.supervisor is not None:
            # SIGTERM to the supervisor (its children run in sessions of their own): it stops
            # them itself, the agent first.
            procs.stop(self.supervisor, grace=60)
        self.pg.stop("fast")
