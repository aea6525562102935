"""Node credentials, in process (console/cluster/tokens.py): enrolment with a one-time join token,
a node's secret speaking for that node only, revocation, the shared token as an opt-in, and the
same decisions where they are used (controller tasks, bundle downloads, the join-token API, the
admin). The end-to-end run with a real agent is in tests/test_node_enrolment.py."""

from __future__ import annotations

import io
import logging
import tarfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.api.models import ApiToken
from console.cluster import tasks as cluster_tasks
from console.cluster import tokens
from console.cluster.models import JoinToken, Node, NodeCredential
from console.core.env import optional_secret
from console.core.models import AuditEntry
from console.jobs.bundles import store_bundle
from console.jobs.models import Allocation, Job, Round
from tests.support.reports import deliver, sealed
from workers import protocol

pytestmark = pytest.mark.django_db

INFO: protocol.NodeInfo = {
    "hostname": "h",
    "address": "10.0.0.7",
    "cpus": 4,
    "memory_bytes": 1 << 30,
    "slots": 4,
    "gpus": [],
    "torch_version": "2.13.0",
    "agent_version": "0.2.0",
    "protocol": protocol.PROTOCOL_VERSION,
}


@pytest.fixture(autouse=True)
def no_shared_token(settings: Any) -> None:
    settings.NODE_TOKEN = ""  # the default outside bin/run
    settings.AXES_FAILURE_LIMIT = 1_000_000  # lockout has its own test


def enrolled(name: str) -> str:
    _, raw_join = tokens.issue_join_token(None, f"for {name}", node_name=name)
    return tokens.enrol(name, raw_join)[1]


def register(token: str, node: str) -> None:
    deliver(cluster_tasks.register, token, node=node, session="s", info=INFO)


def speaks_for(secret: str, node: str) -> bool:
    """A report sealed with ``secret`` and claiming ``node`` is accepted."""
    task = protocol.CONTROL_OFFLINE
    return tokens.agent_authorised(task, sealed(secret, task, node=node, session="s"))


def test_a_nodes_secret_speaks_for_that_node_only(caplog: pytest.LogCaptureFixture) -> None:
    a, b = enrolled("node-a"), enrolled("node-b")
    assert speaks_for(a, "node-a") and speaks_for(b, "node-b")
    with caplog.at_level(logging.WARNING, "console.cluster.tokens"):
        assert not speaks_for(a, "node-b")
        assert not speaks_for("tyn_made-up", "node-a")
        assert not speaks_for("", "node-a")
        assert not speaks_for(a, "node-c")
    assert (
        "not sealed with that node's credential" in caplog.text and "no such node is enrolled" in caplog.text
    )
    # Stored hashed only.
    stored = NodeCredential.objects.get(node_name="node-a")
    assert stored.secret_hash == tokens.hash_secret(a) and a not in str(list(NodeCredential.objects.values()))


def test_registration_through_the_task_needs_the_nodes_own_credential() -> None:
    a, _ = enrolled("node-a"), enrolled("node-b")
    register(a, "node-b")  # node-a posing as node-b
    assert not Node.objects.filter(name="node-b").exists()
    register(a, "node-a")
    assert Node.objects.get(name="node-a").address == "10.0.0.7"


def test_a_revoked_node_is_refused_and_logged(caplog: pytest.LogCaptureFixture, staff: User) -> None:
    secret = enrolled("node-a")
    register(secret, "node-a")
    credential = NodeCredential.objects.get(node_name="node-a")
    assert tokens.revoke(credential, staff) and not tokens.revoke(credential, staff)
    before = Node.objects.get(name="node-a").last_heartbeat
    with caplog.at_level(logging.WARNING, "console.cluster.tokens"):
        deliver(
            cluster_tasks.heartbeat,
            secret,
            node="node-a",
            session="s",
            load={"cpu_percent": 1.0, "memory_percent": 1.0, "gpus": []},
            rounds=[],
        )
    assert Node.objects.get(name="node-a").last_heartbeat == before
    assert "revoked" in caplog.text
    credential.refresh_from_db()
    assert credential.last_refused_at is not None
    assert AuditEntry.objects.filter(action="node.credential_revoked", actor=staff).count() == 1


def test_a_join_token_enrols_once_before_it_expires_and_only_its_node() -> None:
    token, raw = tokens.issue_join_token(None, "one", node_name="node-a")
    assert token.key_hash == tokens.hash_secret(raw) and raw not in str(list(JoinToken.objects.values()))
    with pytest.raises(tokens.EnrolmentRefused, match="for node 'node-a' only"):
        tokens.enrol("node-b", raw)
    _, secret = tokens.enrol("node-a", raw)
    with pytest.raises(tokens.EnrolmentRefused, match="already used"):
        tokens.enrol("node-a", raw)
    assert speaks_for(secret, "node-a")

    _, late = tokens.issue_join_token(None, "late")
    JoinToken.objects.filter(name="late").update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(tokens.EnrolmentRefused, match="expired"):
        tokens.enrol("node-c", late)
    with pytest.raises(tokens.EnrolmentRefused, match="Unknown"):
        tokens.enrol("node-c", "tyj_nope")
    assert not NodeCredential.objects.filter(node_name="node-c").exists()


def test_enrolling_again_replaces_a_revoked_credential() -> None:
    old = enrolled("node-a")
    tokens.revoke(NodeCredential.objects.get(node_name="node-a"), None)
    new = enrolled("node-a")
    assert speaks_for(new, "node-a") and not speaks_for(old, "node-a")


def test_the_shared_token_is_accepted_only_when_opted_in(settings: Any) -> None:
    assert not speaks_for("shared-secret-0123456789", "any-node")
    settings.NODE_TOKEN = "shared-secret-0123456789"
    assert speaks_for("shared-secret-0123456789", "any-node")
    assert not speaks_for("shared-secret-012345678", "any-node")


def test_join_tokens_through_the_api(operator: User, viewer: User, staff: User) -> None:
    client = APIClient()
    client.force_login(operator)
    made = client.post("/api/v1/nodes/join-tokens/", {"name": "gpu-07", "expires_in_hours": 2}, format="json")
    assert made.status_code == 201, made.content
    raw = made.json()["token"]
    assert raw.startswith("tyj_") and made.json()["expires_at"]
    listed = client.get("/api/v1/nodes/join-tokens/").json()
    assert [t["name"] for t in listed] == ["gpu-07"] and "token" not in listed[0]
    bad = client.post("/api/v1/nodes/join-tokens/", {"name": "x", "expires_in_hours": 0}, format="json")
    assert bad.status_code == 400 and "expires_in_hours" in bad.json()["errors"]

    agent = APIClient()
    enrolment = agent.post("/api/v1/nodes/enroll/", {"name": "gpu-07", "join_token": raw}, format="json")
    assert enrolment.status_code == 201 and speaks_for(enrolment.json()["secret"], "gpu-07")
    again = agent.post("/api/v1/nodes/enroll/", {"name": "gpu-07", "join_token": raw}, format="json")
    assert again.status_code == 403 and "already used" in again.json()["detail"]

    viewing = APIClient()
    viewing.force_login(viewer)
    assert viewing.post("/api/v1/nodes/join-tokens/", {"name": "v"}, format="json").status_code == 403
    for scopes, status in ((["read"], 403), (["nodes:write"], 201), (["admin"], 201)):
        scoped = APIClient()
        scoped.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(staff, '-'.join(scopes), scopes)[1]}")
        assert scoped.post("/api/v1/nodes/join-tokens/", {"name": "s"}, format="json").status_code == status
    assert AuditEntry.objects.filter(action="node.join_token_created").count() == 3


def test_bundle_downloads_need_a_node_that_runs_the_bundle(
    settings: Any, tmp_path: Path, operator: User
) -> None:
    settings.BUNDLE_ROOT = tmp_path / "bundles"
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 9
        tar.addfile(info, io.BytesIO(b"print(1)\n"))
    archive = data.getvalue()
    bundle = store_bundle(SimpleUploadedFile("b.tar.gz", archive), operator)
    job = Job.objects.create(name="j", bundle=bundle, entrypoint="train.py", min_nodes=1, max_nodes=1)
    node = Node.objects.create(name="node-a")
    Allocation.objects.create(
        round=Round.objects.create(job=job, number=1, world_size=1, master_port=29500),
        node=node,
        node_rank=0,
        nproc=1,
    )
    own, other = enrolled("node-a"), enrolled("node-b")
    url = f"/api/v1/bundles/{bundle.sha256}/archive/"

    def fetch(secret: str) -> Any:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client.get(url)

    got = fetch(own)
    assert got.status_code == 200 and b"".join(got.streaming_content) == archive
    refused = fetch(other)
    assert refused.status_code == 403 and "runs no job" in refused.json()["detail"]
    tokens.revoke(NodeCredential.objects.get(node_name="node-a"), None)
    revoked = fetch(own)
    assert revoked.status_code == 401 and "revoked" in revoked.json()["detail"]


def test_staff_make_join_tokens_and_revoke_credentials_in_the_admin(staff: User) -> None:
    client = Client()
    client.force_login(staff)
    page = client.post(
        "/admin/cluster/jointoken/add/", {"name": "rack 4", "node_name": "", "hours": "1"}, follow=True
    )
    assert page.status_code == 200
    shown = next(m.message for m in page.context["messages"] if "shown this once" in m.message)
    raw = shown.split(": ", 1)[1].split()[0]
    assert JoinToken.objects.get(name="rack 4").key_hash == tokens.hash_secret(raw)
    secret = tokens.enrol("node-r4", raw)[1]

    credential = NodeCredential.objects.get(node_name="node-r4")
    done = client.post(
        "/admin/cluster/nodecredential/",
        {"action": "revoke", "_selected_action": [credential.pk]},
        follow=True,
    )
    assert done.status_code == 200
    credential.refresh_from_db()
    assert credential.revoked and not speaks_for(secret, "node-r4")


def test_wrong_join_tokens_lock_the_address_out(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    _, good = tokens.issue_join_token(None, "good")
    agent = APIClient()
    statuses = [
        agent.post(
            "/api/v1/nodes/enroll/", {"name": "n", "join_token": "tyj_guess"}, format="json"
        ).status_code
        for _ in range(3)
    ]
    assert statuses[:2] == [403, 403] and statuses[2] in (403, 429)  # the limit-th failure locks
    locked = agent.post("/api/v1/nodes/enroll/", {"name": "n", "join_token": good}, format="json")
    assert locked.status_code == 429 and int(locked["Retry-After"]) > 0
    assert not NodeCredential.objects.exists()


def test_without_the_environment_there_is_no_shared_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TRAINYARD_NODE_TOKEN", raising=False)
    monkeypatch.delenv("TRAINYARD_NODE_TOKEN_FILE", raising=False)
    assert optional_secret("TRAINYARD_NODE_TOKEN") == ""  # nothing generated: opting in is explicit
    (tmp_path / "token").write_text("from-a-file-0123456789\n")
    monkeypatch.setenv("TRAINYARD_NODE_TOKEN_FILE", str(tmp_path / "token"))
    assert optional_secret("TRAINYARD_NODE_TOKEN") == "from-a-file-0123456789"


def test_the_node_list_in_the_admin_shows_each_nodes_credential(staff: User) -> None:
    for name in ("own-1", "revoked-1", "shared-1"):
        Node.objects.create(name=name)
    enrolled("own-1")
    enrolled("revoked-1")
    tokens.revoke(NodeCredential.objects.get(node_name="revoked-1"), staff)
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/cluster/node/")
    rows = {r.name: r.credential_revoked for r in page.context["cl"].result_list}
    assert rows == {"own-1": False, "revoked-1": True, "shared-1": None}
    assert b"shared token" in page.content and b"revoked" in page.content
