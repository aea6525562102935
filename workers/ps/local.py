"""Starts a PS job's processes on this host: the coordinator, M PS and workers, each with the
environment contract of workers/ps/contract.py.

Used by tests and ``bench/ps`` in this round; in the console the agents start the same processes
with the same environment on the controller's orders. Every process gets its own session (so a
signal reaches its children) and ``stop()`` ends them all: SIGTERM, a grace period, SIGKILL.
The job draws its own secret, as the console derives one: its servers are never open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from workers import net
from workers.net import free_port
from workers.ps import auth, contract
from workers.ps.client import CoordinatorClient, PsClient
from workers.ps.contract import Mode, PsEnv, Role


def wait_listening(address: str, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    host, _, port = address.rpartition(":")
    net.wait_listening(host, int(port), timeout, process=process)


@dataclass
class LocalPsJob:
    workdir: Path
    ps_count: int
    mode: Mode = Mode.ASYNC
    seed: int = 0
    lease_s: float = 3.0
    max_staleness: int | None = None
    max_rows: int | None = None
    max_data_bytes: int | None = None
    checkpoint_every_s: float = 30.0
    stats_every_s: float = 1.0
    worker_count: int = 0  # the initial workers (a synchronous job's first step waits for them)
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    secret: str = field(default_factory=auth.new_secret, repr=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ps_addresses = tuple(f"127.0.0.1:{free_port()}" for _ in range(self.ps_count))
        self.coordinator = f"127.0.0.1:{free_port()}"
        self.checkpoint_dir = str(self.workdir / "ps-checkpoints")

    def env(self, role: Role, index: int, worker_count: int = 0, **extra: str) -> dict[str, str]:
        spec = PsEnv(
            role=role,
            index=index,
            ps_addresses=self.ps_addresses,
            coordinator=self.coordinator,
            mode=self.mode,
            worker_count=worker_count,
            max_staleness=self.max_staleness,
            seed=self.seed,
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every_s=self.checkpoint_every_s,
            max_rows=self.max_rows,
            max_data_bytes=self.max_data_bytes,
            lease_s=self.lease_s,
            stats_every_s=self.stats_every_s,
            secret=self.secret,
        )
        env = {key: value for key, value in os.environ.items() if key not in contract.ALL}
        env.update(spec.to_environ())
        env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        env.update(extra)
        env.setdefault("TRAINYARD_TELEMETRY", str(self.workdir / f"telemetry-{role.value}-{index}.jsonl"))
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        process = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def start_coordinator(self) -> None:
        process = self._spawn(
            "coordinator",
            [sys.executable, "-m", "workers.ps.coordinator"],
            self.env(Role.COORDINATOR, 0, self.worker_count),
        )
        wait_listening(self.coordinator, 60, process)

    def start_ps(self, index: int, wait: bool = True) -> subprocess.Popen[bytes]:
        process = self._spawn(
            f"ps-{index}", [sys.executable, "-m", "workers.ps.server"], self.env(Role.PS, index)
        )
        if wait:
            wait_listening(self.ps_addresses[index], 60, process)
        return process

    def start_servers(self) -> None:
        self.start_coordinator()
        started = [self.start_ps(index, wait=False) for index in range(self.ps_count)]
        for index, process in enumerate(started):
            wait_listening(self.ps_addresses[index], 60, process)

    def start_worker(
        self, index: int, argv: list[str], worker_count: int = 0, **extra: str
    ) -> subprocess.Popen[bytes]:
        env = self.env(Role.WORKER, index, worker_count, **extra)
        env.setdefault(contract.ENV_WORKER_ID, f"worker-{index}-{time.monotonic_ns()}")
        return self._spawn(f"worker-{index}", [sys.executable, *argv], env)

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def client(self, worker: str = "observer") -> PsClient:
        return PsClient(self.ps_addresses, worker, retry_s=30, secret=self.secret)

    def coordinator_client(self, worker: str = "observer") -> CoordinatorClient:
        return CoordinatorClient(self.coordinator, worker, retry_s=30, secret=self.secret)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, sig)
        if sig == signal.SIGKILL:
            process.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every live process's group, then SIGKILL to what is left after ``grace``."""
        live = [p for p in self.processes.values() if p.poll() is None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in live:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
