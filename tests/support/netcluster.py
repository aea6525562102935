"""A console on a bridge and one agent per network-namespace host (tests/support/netns.py), set up
as README's "Adding a host" says: Redis with a password bound to the bridge's address, Daphne on
that address with it in ALLOWED_HOSTS, a controller; an operator's API token; per host a join
token from ``POST /api/v1/nodes/join-tokens/`` and an agent that enrols with it. Everything the
test does goes through the console's HTTP API, as an operator's script would.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import Group, User

from tests.support.agents import AgentProcess
from tests.support.controller import service_env
from tests.support.netns import Host, Hosts, agent_in_namespace
from tests.support.services import Console, RedisServer

HEARTBEAT = 1.0


@dataclass
class NetCluster:
    hosts: Hosts
    console: Console
    redis: RedisServer
    root: Path
    token: str = ""
    agents: dict[str, AgentProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.console.url

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kwargs)

    def login(self, user: User) -> None:
        """An API token for ``user``, as the Tokens page makes one."""
        from console.api.models import ApiToken

        _, self.token = ApiToken.issue(user, "netns", scopes=["read", "jobs:write", "nodes:write"])

    def join_token(self, name: str) -> str:
        answer = self.api("POST", "/api/v1/nodes/join-tokens/", json={"name": name, "node_name": name})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    def start_agent(self, host: Host, *, enrol: bool = True, warm_pool: int = 1) -> AgentProcess:
        agent = agent_in_namespace(
            self.hosts,
            host,
            broker_url=self.redis.url,
            console_url=self.url,
            join_token=self.join_token(host.name) if enrol else "",
            root=self.root,
            checkpoint_root=self.checkpoints,
            heartbeat=HEARTBEAT,
            warm_pool=warm_pool,
        )
        self.agents[host.name] = agent
        return agent

    def nodes(self) -> dict[str, dict[str, Any]]:
        answer = self.api("GET", "/api/v1/nodes/")
        assert answer.status_code == 200, answer.text
        return {n["name"]: n for n in answer.json()["results"]}

    def wait_online(self, *names: str, timeout: float = 120) -> dict[str, dict[str, Any]]:
        def online() -> dict[str, dict[str, Any]] | None:
            nodes = self.nodes()
            return nodes if all(nodes.get(n, {}).get("state") == "ONLINE" for n in names) else None

        return wait(online, timeout, f"nodes {names} ONLINE", self.diagnose)

    def upload(self, *files: Path) -> int:
        """A bundle of ``files`` (at its top level), as ``trainyard bundle`` uploads it."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for path in files:
                archive.add(path, arcname=path.name)
        answer = self.api("POST", "/api/v1/bundles/", files={"file": ("code.tar.gz", buffer.getvalue())})
        assert answer.status_code in (200, 201), answer.text
        return int(answer.json()["id"])

    def submit(self, body: dict[str, Any]) -> int:
        answer = self.api("POST", "/api/v1/jobs/", json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        answer = self.api("GET", f"/api/v1/jobs/{job_id}/")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def events(self, job_id: int) -> list[dict[str, Any]]:
        answer = self.api("GET", f"/api/v1/jobs/{job_id}/events/", params={"page_size": 500})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        return list(body["results"] if isinstance(body, dict) else body)

    def wait_state(self, job_id: int, *states: str, timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] in states else None

        return wait(reached, timeout, f"job {job_id} in {states}", lambda: self.diagnose(job_id))

    def diagnose(self, job_id: int | None = None) -> str:
        parts = []
        if job_id is not None:
            with contextlib.suppress(Exception):
                parts.append(json.dumps(self.job(job_id))[:1500])
                parts += [f"  {e.get('kind')}: {e.get('message')}" for e in self.events(job_id)[-30:]]
        for controller in self.console.controllers:
            parts.append(f"--- controller\n{controller.tail(40)}")
        for agent in self.agents.values():
            parts.append(f"--- agent {agent.name}\n" + "\n".join(agent.log().splitlines()[-30:]))
        return "\n".join(parts)


def wait(check: Callable[[], Any], timeout: float, what: str, diagnose: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")


@pytest.fixture
def net_cluster(transactional_db: None, tmp_path: Path, netns_hosts: Hosts) -> Iterator[NetCluster]:
    """A console on the bridge (Redis with a password, web, controller), an operator logged in
    over the API; the agents are the test's to start (``start_agent``)."""
    bridge = netns_hosts.bridge_address
    redis = RedisServer(tmp_path / "redis", appendonly=False, bind=bridge, password=secrets.token_hex(16))
    redis.start()
    env = service_env(
        redis.url,
        tmp_path / "home",
        ALLOWED_HOSTS=f"{bridge},localhost,127.0.0.1",
        TRAINYARD_NODE_TOKEN="",  # the hosts enrol: no shared token
        TRAINYARD_HEARTBEAT_INTERVAL=str(HEARTBEAT),
        TRAINYARD_HEARTBEAT_MISSES="4",  # a loaded 2-core machine: a busy agent must not look lost
        TRAINYARD_CONTROLLER_TICK="0.5",
        TRAINYARD_BUNDLE_ROOT=str(settings.BUNDLE_ROOT),
    )
    console = Console(tmp_path, env)
    operator = User.objects.create_user("net-operator")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    cluster = NetCluster(netns_hosts, console, redis, tmp_path)
    try:
        console.start_web(host=bridge)
        console.start_controller()
        cluster.login(operator)
        yield cluster
    finally:
        console.stop(grace=10)
        for agent in cluster.agents.values():
            if agent.popen.poll() is None:
                agent.kill()
        redis.stop()
