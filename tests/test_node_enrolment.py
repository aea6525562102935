"""A real agent enrols with a join token over HTTP, registers and heartbeats through Celery with
its own credential, and is refused once an operator revokes it; bundle downloads over HTTP take
only the credential of a node that runs the bundle. The controller here has the shared node
token turned off. Decisions in detail: tests/test_node_credentials.py."""

from __future__ import annotations

import io
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile

from console.cluster import tokens
from console.cluster.models import JoinToken, Node, NodeCredential
from console.core.transport import command_signer
from console.jobs.bundles import store_bundle
from console.jobs.models import Allocation, Job, Round
from tests.support.agents import AgentProcs
from tests.support.controller import Controller, wait_for
from workers.agent.config import parse_config
from workers.agent.credential import (
    CONSOLE_KEY_FILE,
    CREDENTIAL_FILE,
    CredentialError,
    enrol,
    resolve_credential,
)
from workers.net import free_port

pytestmark = pytest.mark.cluster


@pytest.fixture
def controller(transactional_db: None, tmp_path: Path) -> Iterator[Controller]:
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    started = Controller(settings.REDIS_URL, tmp_path / "controller", TRAINYARD_NODE_TOKEN="")
    started.start()
    try:
        yield started
    finally:
        started.kill()  # its state is in PostgreSQL: nothing to wind down at the end of a test
        redis.Redis.from_url(settings.REDIS_URL).flushdb()


def test_an_agent_enrols_with_a_join_token_and_is_refused_once_revoked(
    controller: Controller, console_url: str, tmp_path: Path, staff: User, settings: Any
) -> None:
    _, join = tokens.issue_join_token(staff, "for enr-1", node_name="enr-1")
    agents = AgentProcs(tmp_path, settings.REDIS_URL, token="", warm_pool=0)
    try:
        agent = agents.start("enr-1", extra_args=["--join-token", join, "--console", console_url])
        node = wait_for(
            lambda: Node.objects.filter(name="enr-1", last_heartbeat__isnull=False).first(),
            90,
            message=f"enr-1 to register and heartbeat\n{agent.log()}\n{controller.tail()}",
        )
        stored = agent.data_dir / CREDENTIAL_FILE
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        # it learnt the console's command key too (the key it verifies every command with)
        assert (agent.data_dir / CONSOLE_KEY_FILE).read_text().strip() == command_signer().public_key
        secret = stored.read_text().strip()
        credential = NodeCredential.objects.get(node_name="enr-1")
        assert (
            credential.secret_hash == tokens.hash_secret(secret)
            and JoinToken.objects.get().used_by == "enr-1"
        )

        # Bundle downloads over HTTP: the node's own credential for its own job's bundle only.
        archive = small_archive()
        bundle = store_bundle(SimpleUploadedFile("b.tar.gz", archive), staff)
        job = Job.objects.create(name="e", bundle=bundle, entrypoint="train.py")
        place = Round.objects.create(job=job, number=1, world_size=1, master_port=29500)
        Allocation.objects.create(round=place, node=node, node_rank=0, nproc=1)
        other = tokens.enrol("enr-2", tokens.issue_join_token(None, "enr-2")[1])[1]
        url = f"{console_url}/api/v1/bundles/{bundle.sha256}/archive/"
        own = requests.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
        assert own.status_code == 200 and own.content == archive
        assert requests.get(url, headers={"Authorization": f"Bearer {other}"}, timeout=30).status_code == 403

        tokens.revoke(credential, staff)
        wait_for(
            lambda: NodeCredential.objects.filter(pk=credential.pk, last_refused_at__isnull=False).exists(),
            30,
            message=f"the controller to refuse enr-1's heartbeats\n{controller.tail()}",
        )
        # Heartbeats keep coming every 0.5 s and none is acted on: after three more refusals (each
        # one logged; a heartbeat accepted just before the revocation is written by then), the
        # node's last heartbeat stays what it is over three more.
        wait_refusals(controller, 3)
        seen = Node.objects.get(name="enr-1").last_heartbeat
        wait_refusals(controller, 3)
        assert Node.objects.get(name="enr-1").last_heartbeat == seen
        assert requests.get(url, headers={"Authorization": f"Bearer {secret}"}, timeout=30).status_code == 401
        assert agent.popen.poll() is None, "the agent keeps running; the console refuses it"
    finally:
        agents.cleanup()


def wait_refusals(controller: Controller, more: int) -> None:
    """Until the controller has refused ``more`` further messages of enr-1 (it logs every one)."""

    def refusals() -> int:
        return controller.log_path.read_text().count("refusing a message from node 'enr-1': revoked")

    already = refusals()
    wait_for(lambda: refusals() >= already + more, 30, message=f"{more} more refused messages of enr-1")


def small_archive() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = 9
        archive.addfile(info, io.BytesIO(b"print(1)\n"))
    return data.getvalue()


def test_the_agent_says_how_to_enrol_when_it_has_no_credential(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("TRAINYARD_NODE_TOKEN", raising=False)
    config = parse_config(["--name", "bare", "--data-dir", str(tmp_path / "bare")])
    with pytest.raises(CredentialError, match="--join-token"):
        resolve_credential(config)
    with pytest.raises(CredentialError, match="--console"):
        resolve_credential(
            parse_config(["--name", "bare", "--data-dir", str(tmp_path), "--join-token", "tyj_x"])
        )
    with pytest.raises(CredentialError, match="cannot reach the console"):
        enrol(f"http://127.0.0.1:{free_port()}", "bare", "tyj_x", patience=0.5)
    # Once enrolled, the stored credential wins over a join token and the shared token.
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / CREDENTIAL_FILE).write_text("tyn_kept\n")
    kept = parse_config(
        ["--name", "k", "--data-dir", str(tmp_path / "kept"), "--join-token", "x", "--token", "t"]
    )
    assert resolve_credential(kept) == "tyn_kept"
    assert (
        resolve_credential(parse_config(["--name", "s", "--data-dir", str(tmp_path), "--token", "t"])) == "t"
    )
