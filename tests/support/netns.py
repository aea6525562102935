"""Hosts made of network namespaces, for multi-host tests and benches.

A bridge in the root namespace (the console host: it holds the bridge's address) and N
namespaces, each a "host" with its own private address on interface ``eth0`` (a veth whose other
end is on the bridge) and no default route, so no DNS server either; the host name still
resolves to loopback (/etc/hosts is shared), as on a default Debian or Ubuntu install. The
addresses are a random /24 of 10.0.0.0/8 that no interface or route here uses yet; everything is
removed again by ``destroy()`` (also on failure: the fixture and ``with`` call it), processes
left in a namespace first.

    with Hosts.make(3) as hosts:              # pytest.skip where namespaces cannot be made
        hosts.bridge_address                  # where the console's processes listen
        hosts[0].address, hosts[0].namespace, hosts.wrap(hosts[0], argv)
        hosts.cut(hosts[2]); hosts.restore(hosts[2])   # ip link set ... down / up

``NetCluster`` runs a console on the bridge (Redis with a password, Daphne, a controller) and
enrols one agent per host with a join token, as README's "Adding a host" says.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import procs
from tests.support.agents import AgentProcess

IP = shutil.which("ip") or "/usr/sbin/ip"
PREFIX = 24


class NetnsUnavailable(Exception):
    """Namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class Host:
    name: str  # also the agent's node name
    namespace: str
    address: str
    veth: str  # the root namespace's end of its link (cut() takes it down)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the suite as root, as CI does)"
    if not os.access(IP, os.X_OK):
        return "no `ip` command (iproute2) to make network namespaces"
    return ""


def _taken_subnets() -> set[str]:
    shown = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    return {".".join(word.split(".")[:3]) for word in shown.split() if word.count(".") == 3}


@dataclass
class Hosts:
    tag: str
    subnet: str  # "10.A.B"
    hosts: list[Host] = field(default_factory=list)
    made_namespaces: list[str] = field(default_factory=list)
    bridge_made: bool = False

    @property
    def bridge(self) -> str:
        return f"tyb{self.tag}"

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @classmethod
    def make(cls, count: int) -> Hosts:
        """``count`` hosts on a new bridge; NetnsUnavailable when they cannot be made."""
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        taken = _taken_subnets()
        rng = random.Random()
        subnet = ""
        for _ in range(100):
            candidate = f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 256)}"
            if candidate not in taken:
                subnet = candidate
                break
        hosts = cls(tag=uuid.uuid4().hex[:5], subnet=subnet)
        try:
            hosts._create(count)
        except (subprocess.CalledProcessError, OSError) as exc:
            hosts.destroy()
            said = getattr(exc, "stderr", "") or str(exc)
            raise NetnsUnavailable(f"cannot make network namespaces here: {said.strip()}") from exc
        return hosts

    def _create(self, count: int) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.bridge_made = True
        _ip("addr", "add", f"{self.bridge_address}/{PREFIX}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index in range(count):
            name = f"host-{index}"
            namespace = f"ty{self.tag}-{index}"
            veth = f"tyv{self.tag}{index}"
            address = f"{self.subnet}.{index + 2}"
            _ip("netns", "add", namespace)
            self.made_namespaces.append(namespace)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/{PREFIX}", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            self.hosts.append(Host(name, namespace, address, veth))

    def wrap(self, host: Host, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace (``ip netns exec`` execs it: same pid)."""
        return [IP, "netns", "exec", host.namespace, *argv]

    def pids(self, host: Host) -> list[int]:
        """Every process in ``host``'s namespace."""
        out = _ip("netns", "pids", host.namespace, check=False).stdout
        return [int(word) for word in out.split() if word.isdigit()]

    def kill_all(self, host: Host) -> list[int]:
        """SIGKILL every process in ``host``'s namespace (the host dies); returns their pids."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def cut(self, host: Host) -> None:
        """The host's link goes down (its processes live on, unreachable)."""
        _ip("link", "set", host.veth, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def destroy(self) -> None:
        """Every process left in the namespaces killed, the namespaces (with their links) and the
        bridge removed. Safe to call twice."""
        for namespace in reversed(self.made_namespaces):
            out = _ip("netns", "pids", namespace, check=False).stdout
            for word in out.split():
                if word.isdigit():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(word), signal.SIGKILL)
            _ip("netns", "del", namespace, check=False)
        self.made_namespaces.clear()
        if self.bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self.bridge_made = False
        self.hosts.clear()


@pytest.fixture
def netns_hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """Three hosts (a test module's NETNS_HOSTS says how many), removed after the test."""
    try:
        hosts = Hosts.make(int(getattr(request.module, "NETNS_HOSTS", 3)))
    except NetnsUnavailable as exc:
        pytest.skip(f"multi-host test skipped: {exc}")
    try:
        yield hosts
    finally:
        hosts.destroy()


def agent_in_namespace(
    hosts: Hosts,
    host: Host,
    *,
    broker_url: str,
    console_url: str,
    join_token: str,
    root: Path,
    checkpoint_root: Path,
    heartbeat: float = 1.0,
    warm_pool: int = 1,
    die_with_parent: bool = False,
) -> AgentProcess:
    """The agent of ``host``, started as README's "Adding a host" says: the join token and the
    broker URL (with Redis's password) in its environment, ``--console`` the console's URL; no
    ``--address``, no node token, no database. A second start (enrolled already) passes
    ``join_token=""``."""
    data_dir = root / "agents" / host.name
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"agent-{host.name}.log"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINYARD_", "DATABASE_", "REDIS_", "TEST_"))
    }
    env.update(TRAINYARD_BROKER_URL=broker_url, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if join_token:
        env["TRAINYARD_JOIN_TOKEN"] = join_token
    argv = [
        sys.executable,
        "-m",
        "workers.agent",
        "--name",
        host.name,
        "--console",
        console_url,
        "--checkpoint-root",
        str(checkpoint_root),
        "--data-dir",
        str(data_dir),
        "--heartbeat",
        str(heartbeat),
        "--warm-pool",
        str(warm_pool),
    ]
    popen: subprocess.Popen[Any] = procs.spawn(
        hosts.wrap(host, argv),
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        log=log,
        stdin=subprocess.DEVNULL,
        die_with_parent=die_with_parent,
    )
    return AgentProcess(host.name, popen, data_dir, checkpoint_root, log)
