"""Helpers for tests that run real agents: start them as subprocesses, act as the controller
by reading the real Celery messages they send to queue ``control`` and sending real AGENT_*
tasks, and clean up every process by pid even when a test fails.

    def test_something(agent_procs: AgentProcs, control_queue: ControlQueue) -> None:
        agent = agent_procs.start("gpu-01", data_root=tmp_path)
        register = control_queue.wait_for(protocol.CONTROL_REGISTER, node="gpu-01")
        control_queue.send("gpu-01", protocol.AGENT_START_ROUND, spec=round_spec(...))
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from celery import Celery

from tests.support import procs
from workers import protocol
from workers.net import free_port
from workers.protocol import RoundSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
DDP_SCRIPT = REPO_ROOT / "tests" / "scripts" / "ddp_train.py"
AGENT_STOP_TIMEOUT = 60.0
TEST_WARM_POOL = 2
"""Tests' agents keep 2 warm interpreters, not the product's default (workers.agent.warmpool):
several agents share this machine's two cores with the suite, and each import costs a second
of CPU. Pass ``warm_pool=None`` for the product default."""


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/1")


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """True while the process runs. A zombie has exited (its parent just has not reaped it),
    and a pid reused by a newer process is not the one we meant."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.5:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


@dataclass
class AgentProcess:
    name: str
    popen: subprocess.Popen[bytes]
    data_dir: Path
    checkpoint_root: Path
    log_path: Path
    known_pids: dict[int, float] = field(default_factory=dict)  # pid -> create time

    @property
    def pid(self) -> int:
        return self.popen.pid

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def remember_descendants(self) -> None:
        for proc in self.descendants():
            with contextlib.suppress(psutil.NoSuchProcess):
                self.known_pids[proc.pid] = proc.create_time()

    def stop(self, timeout: float = AGENT_STOP_TIMEOUT) -> int:
        """SIGTERM (a clean agent shutdown) and wait for the exit code."""
        self.remember_descendants()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        self.remember_descendants()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def agent_argv(
    name: str,
    broker: str,
    *,
    data_dir: Path,
    checkpoint_root: Path,
    heartbeat: float,
    warm_pool: int | None,
    token: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """An agent for host ``name``; its token from the environment unless given (argv is
    readable by every local user: tests only)."""
    return [
        sys.executable,
        "-m",
        "workers.agent",
        "--name",
        name,
        "--broker",
        broker,
        # (a random token may start with "-", which argparse takes for an option)
        *([f"--token={token}"] if token is not None else []),
        "--address",
        "127.0.0.1",
        "--heartbeat",
        str(heartbeat),
        "--data-dir",
        str(data_dir),
        "--checkpoint-root",
        str(checkpoint_root),
        *([] if warm_pool is None else ["--warm-pool", str(warm_pool)]),
        *(extra or []),
    ]


def start_agent(
    name: str,
    broker_url: str,
    *,
    token: str | None,
    data_dir: Path,
    checkpoint_root: Path,
    heartbeat: float = 0.5,
    warm_pool: int | None = TEST_WARM_POOL,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    die_with_parent: bool = False,
) -> AgentProcess:
    """An agent process (registered with procs: stopped with everything else on SIGTERM, Ctrl-C
    or exit), its output in ``agent-<name>.log`` beside its data directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"agent-{name}.log"
    popen = procs.spawn(
        agent_argv(
            name,
            broker_url,
            data_dir=data_dir,
            checkpoint_root=checkpoint_root,
            heartbeat=heartbeat,
            warm_pool=warm_pool,
            token=token,
            extra=extra_args,
        ),
        cwd=REPO_ROOT,
        env={**(env or os.environ), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        log=log_path,
        stdin=subprocess.DEVNULL,
        die_with_parent=die_with_parent,
    )
    return AgentProcess(name, popen, data_dir, checkpoint_root, log_path)


def warm_processes(agent: AgentProcess) -> list[psutil.Process]:
    """The agent's idle warm-pool interpreters (importing, paused or ready)."""
    found = []
    for proc in agent.descendants():
        with contextlib.suppress(psutil.Error):
            if "workers.agent.warm" in proc.cmdline():
                found.append(proc)
    return found


def _all_idle(procs: list[psutil.Process]) -> bool:
    """None paused and none using CPU for half a second: imports done, waiting for a launch."""
    try:
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(0.5)
        after = [sum(p.cpu_times()[:2]) for p in procs]
        running = all(p.status() != psutil.STATUS_STOPPED for p in procs)
    except psutil.Error:
        return False
    return running and all(b - a < 0.01 for a, b in zip(before, after, strict=True))


def wait_pool_ready(agent: AgentProcess, size: int, timeout: float = 120.0) -> None:
    """Until ``size`` idle warm interpreters exist, all done importing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = warm_processes(agent)
        if len(procs) >= size and _all_idle(procs):
            return
        time.sleep(0.2)
    raise RuntimeError(f"warm pool of {agent.name} not ready within {timeout:.0f} s")


def wait_pool_settled(agent: AgentProcess, timeout: float = 120.0) -> None:
    """Until the pool has stopped refilling (the same interpreters for two seconds, at least
    one, all done importing): whatever size it aims at after the rounds it has seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = {p.pid for p in warm_processes(agent)}
        time.sleep(1.5)
        procs = warm_processes(agent)
        if first and {p.pid for p in procs} == first and _all_idle(procs):
            return
    raise RuntimeError(f"warm pool of {agent.name} not settled within {timeout:.0f} s")


class AgentProcs:
    """Every agent a test starts; ``cleanup`` kills agents and all their descendants by pid."""

    def __init__(
        self,
        root: Path,
        broker_url: str,
        token: str | None = "node-token-1",
        warm_pool: int | None = TEST_WARM_POOL,
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.root = root
        self.broker_url = broker_url
        self.token = token
        self.warm_pool = warm_pool
        self.env = env
        self.die_with_parent = die_with_parent
        self.agents: list[AgentProcess] = []

    def start(
        self,
        name: str,
        *,
        heartbeat: float = 0.5,
        extra_args: list[str] | None = None,
    ) -> AgentProcess:
        agent = start_agent(
            name,
            self.broker_url,
            token=self.token,
            data_dir=self.root / "agents" / name,
            checkpoint_root=self.root / "checkpoints",
            heartbeat=heartbeat,
            warm_pool=self.warm_pool,
            extra_args=extra_args,
            env=self.env,
            die_with_parent=self.die_with_parent,
        )
        self.agents.append(agent)
        return agent

    def cleanup(self) -> None:
        for agent in self.agents:
            agent.remember_descendants()
        for agent in self.agents:
            procs.kill(agent.popen)  # its group and every descendant it was seen with
        for agent in self.agents:
            for pid, created in agent.known_pids.items():
                if pid_alive(pid, created):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        leftovers = [
            pid
            for agent in self.agents
            for pid, created in agent.known_pids.items()
            if pid_alive(pid, created)
        ]
        wait_until(lambda: not any(pid_alive(pid) for pid in leftovers), 10)


@dataclass
class ControlMessage:
    task: str
    kwargs: dict[str, Any]


class ControlQueue:
    """The controller's side of the wire, for tests: pops the Celery protocol-2 messages agents
    send to queue ``control`` straight from Redis, and sends AGENT_* tasks through Celery."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.redis = redis.Redis.from_url(url)
        self.app = Celery("trainyard-test-controller", broker=url, set_as_current=False)
        self.app.conf.update(task_serializer="json", accept_content=["json"])
        self.history: list[ControlMessage] = []
        self._unclaimed: list[ControlMessage] = []

    @staticmethod
    def decode(raw: bytes | str) -> ControlMessage:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        return ControlMessage(task=envelope["headers"]["task"], kwargs=kwargs)

    def purge(self) -> None:
        self.redis.delete(protocol.CONTROL_QUEUE)
        self._unclaimed.clear()

    def pop(self, timeout: float) -> ControlMessage | None:
        popped = self.redis.brpop([protocol.CONTROL_QUEUE], timeout=max(1, int(timeout + 0.999)))
        if popped is None:
            return None
        message = self.decode(popped[1])
        self.history.append(message)
        return message

    def wait_for(
        self,
        task: str,
        timeout: float = 30.0,
        match: Callable[[ControlMessage], bool] | None = None,
        **kwargs: Any,
    ) -> ControlMessage:
        """The first message of ``task`` whose kwargs include ``kwargs`` (and that ``match``
        accepts). Messages popped on the way stay available to later calls."""

        def wanted(message: ControlMessage) -> bool:
            return (
                message.task == task
                and all(message.kwargs.get(k) == v for k, v in kwargs.items())
                and (match is None or match(message))
            )

        for index, message in enumerate(self._unclaimed):
            if wanted(message):
                return self._unclaimed.pop(index)
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            popped = self.pop(min(remaining, 1.0))
            if popped is None:
                continue
            if wanted(popped):
                return popped
            self._unclaimed.append(popped)
        seen = sorted({(m.task, m.kwargs.get("node")) for m in self._unclaimed})
        raise AssertionError(f"no {task} {kwargs} within {timeout:.0f} s; unclaimed: {seen}")

    def drain(self, seconds: float) -> list[ControlMessage]:
        """Everything that arrives within ``seconds`` (plus what was unclaimed)."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.pop(min(remaining, 1.0))
            if message is not None:
                self._unclaimed.append(message)
        drained, self._unclaimed = self._unclaimed, []
        return drained

    def send(self, node: str, task: str, **kwargs: Any) -> None:
        """Sealed with the console's key, as the controller's commands are (console/core/transport.py)."""
        from console.core.transport import Command, sealed

        queue = protocol.node_queue(node)
        self.app.send_task(task, kwargs=sealed(Command(task, queue, kwargs)), queue=queue)

    def send_unsealed(self, node: str, task: str, **kwargs: Any) -> None:
        """What anyone who can write to the broker can send: no seal."""
        self.app.send_task(task, kwargs=kwargs, queue=protocol.node_queue(node))

    def close(self) -> None:
        self.redis.close()


def one_rank_round(
    job_id: int, entrypoint: Path, args: list[str] | None = None, round_: int = 1
) -> RoundSpec:
    """A round of one node and one rank running ``entrypoint`` with ``args``."""
    return round_spec(
        job_id=job_id,
        round_=round_,
        node_rank=0,
        nnodes=1,
        nproc_per_node=1,
        master_port=free_port(),
        entrypoint=str(entrypoint),
        args=args or [],
    )


def round_spec(
    *,
    job_id: int,
    round_: int,
    node_rank: int,
    nnodes: int,
    master_port: int,
    args: list[str],
    nproc_per_node: int = 2,
    entrypoint: str = str(DDP_SCRIPT),
    restart_count: int = 0,
    grace_period: float = 10.0,
    env: dict[str, str] | None = None,
) -> RoundSpec:
    return RoundSpec(
        job_id=job_id,
        round=round_,
        run_id=f"job-{job_id}",
        node_rank=node_rank,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        world_size=nnodes * nproc_per_node,
        master_addr="127.0.0.1",
        master_port=master_port,
        workload="",
        entrypoint=entrypoint,
        args=args,
        bundle=None,
        workdir=str(REPO_ROOT),
        env=env or {},
        hyperparameters={"lr": 0.01},
        strategy="allreduce",
        precision="fp32",
        grad_accum_steps=1,
        gpu_indices=[],
        restart_count=restart_count,
        max_restarts=3,
        grace_period=grace_period,
    )


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def control_queue() -> Iterator[ControlQueue]:
    queue = ControlQueue(redis_url())
    queue.purge()
    yield queue
    queue.purge()
    queue.close()


@pytest.fixture
def agent_procs(tmp_path: Path) -> Iterator[AgentProcs]:
    procs = AgentProcs(tmp_path, redis_url())
    try:
        yield procs
    finally:
        procs.cleanup()


def start_registered(
    procs: AgentProcs, queue: ControlQueue, name: str, *, heartbeat: float = 0.5, timeout: float = 30.0
) -> tuple[AgentProcess, ControlMessage]:
    """Starts an agent and waits for its CONTROL_REGISTER (so its queue is purged and it is
    about to consume: commands sent from now on reach it)."""
    agent = procs.start(name, heartbeat=heartbeat)
    try:
        message = queue.wait_for(protocol.CONTROL_REGISTER, timeout=timeout, node=name)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nagent log:\n{agent.log()[-4000:]}") from exc
    return agent, message


def rank_pids(message: ControlMessage, job_id: int, round_: int) -> list[int]:
    """The pids a heartbeat reports for one round."""
    for status in message.kwargs["rounds"]:
        if status["job_id"] == job_id and status["round"] == round_:
            return [rank["pid"] for rank in status["ranks"]]
    return []


def start_all_registered(
    procs: AgentProcs, queue: ControlQueue, names: list[str], *, heartbeat: float = 0.5, timeout: float = 45.0
) -> list[AgentProcess]:
    """Starts agents side by side (each boot imports torch: seconds) and waits for all to
    register."""
    agents = [procs.start(name, heartbeat=heartbeat) for name in names]
    for agent in agents:
        try:
            queue.wait_for(protocol.CONTROL_REGISTER, timeout=timeout, node=agent.name)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent log:\n{agent.log()[-4000:]}") from exc
    return agents
