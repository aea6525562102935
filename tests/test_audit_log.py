"""The audit log: every change a person makes, with who, when, from where and how they signed in;
read-only for staff on a page and at /api/v1/audit/."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from console.api.models import ApiToken
from console.cluster.models import Node
from console.core.models import AuditEntry
from console.jobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_hashing(settings: Any, tmp_path: Path) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.BUNDLE_ROOT = tmp_path / "bundles"


def archive() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    return data.getvalue()


def entry(action: str) -> AuditEntry:
    return AuditEntry.objects.filter(action=action).latest("id")


def test_sign_ins_and_failures_record_address_and_method(operator: User) -> None:
    web = Client(REMOTE_ADDR="192.0.2.10")
    web.post("/accounts/login/", {"username": "olivia", "password": "nope"})
    web.post("/accounts/login/", {"username": "olivia", "password": "pw-operator-1"})
    web.post("/accounts/logout/")
    APIClient(REMOTE_ADDR="192.0.2.11").post(
        "/api/v1/auth/token/",
        {"username": "olivia", "password": "pw-operator-1", "name": "cli"},
        format="json",
    )

    failed = entry("auth.login_failed")
    assert (failed.actor, failed.actor_name, failed.source_address, failed.auth_method) == (
        None,
        "olivia",
        "192.0.2.10",
        "password",
    )
    logins = list(AuditEntry.objects.filter(action="auth.login").order_by("id"))
    assert [(e.actor, e.source_address, e.auth_method, e.data["place"]) for e in logins] == [
        (operator, "192.0.2.10", "password", "web"),
        (operator, "192.0.2.11", "password", "api"),
    ]
    assert entry("auth.logout").actor == operator
    created = entry("token.create")
    assert (created.actor, created.source_address, created.data["name"]) == (operator, "192.0.2.11", "cli")


def test_writes_through_a_token_name_the_token(operator: User) -> None:
    token, raw = ApiToken.issue(operator, "ci", ["read", "jobs:write", "nodes:write"])
    api = APIClient(REMOTE_ADDR="198.51.100.7")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    job = api.post("/api/v1/jobs/", {"name": "a", "workload": "digits-mlp"}, format="json").json()
    api.post(f"/api/v1/jobs/{job['id']}/stop/")
    node = Node.objects.create(name="n1")
    api.post(f"/api/v1/nodes/{node.pk}/drain/")
    upload = SimpleUploadedFile("code.tar.gz", archive())
    bundle = api.post("/api/v1/bundles/", {"file": upload}, format="multipart").json()

    for action, target in (
        ("job.submit", str(job["id"])),
        ("job.stop", str(job["id"])),
        ("node.drain", str(node.pk)),
        ("bundle.upload", str(bundle["id"])),
    ):
        e = entry(action)
        assert (e.actor, e.target_id, e.source_address, e.auth_method, e.token_prefix) == (
            operator,
            target,
            "198.51.100.7",
            "token",
            token.prefix,
        ), action
    assert entry("bundle.upload").data["sha256"] == bundle["sha256"]


def test_session_writes_and_token_revokes_are_recorded(operator: User) -> None:
    api = APIClient(REMOTE_ADDR="203.0.113.5")
    api.force_login(operator)
    made = api.post("/api/v1/tokens/", {"name": "tmp"}, format="json").json()
    api.delete(f"/api/v1/tokens/{made['id']}/")
    revoked = entry("token.revoke")
    assert (revoked.actor, revoked.target_id, revoked.auth_method, revoked.source_address) == (
        operator,
        str(made["id"]),
        "session",
        "203.0.113.5",
    )


def test_admin_edits_single_and_bulk_are_recorded(staff: User) -> None:
    admin = Client(REMOTE_ADDR="192.0.2.99")
    admin.force_login(staff)
    target = User.objects.create_user("bob", password="pw-bob-1")
    page = reverse("admin:auth_user_change", args=[target.pk])
    form = admin.get(page).context["adminform"].form
    data = {
        k: v
        for k, v in form.initial.items()
        if v is not None and k not in ("groups", "user_permissions", "password")
    }
    data.update(
        username="bob",
        first_name="Robert",
        last_login_0="",
        last_login_1="",
        date_joined_0="2026-01-01",
        date_joined_1="00:00:00",
    )
    response = admin.post(page, data)
    assert response.status_code == 302, response.content[:500]
    changed = entry("admin.change")
    assert (changed.actor, changed.target_type, changed.target_id, changed.source_address) == (
        staff,
        "user",
        str(target.pk),
        "192.0.2.99",
    )

    groups = [Group.objects.create(name=f"g{i}") for i in range(3)]
    admin.post(
        reverse("admin:auth_group_changelist"),
        {"action": "delete_selected", "_selected_action": [g.pk for g in groups], "post": "yes"},
    )
    assert not Group.objects.filter(name__startswith="g").exists()
    deleted = AuditEntry.objects.filter(action="admin.delete", target_type="group")
    assert sorted(e.target_id for e in deleted) == sorted(str(g.pk) for g in groups)
    assert {e.actor for e in deleted} == {staff}

    token, _ = ApiToken.issue(staff, "t", ["read"])
    admin.post(reverse("admin:api_apitoken_changelist"), {"action": "revoke", "_selected_action": [token.pk]})
    assert entry("token.revoke").data["how"] == "admin"


def test_the_audit_api_filters_and_is_for_staff_only(staff: User, operator: User) -> None:
    api = APIClient()
    api.force_login(staff)
    AuditEntry.objects.all().delete()  # the sign-in above
    AuditEntry.record_raw(operator, "job.submit", target_type="job", target_id="1", via="token")
    AuditEntry.record_raw(operator, "auth.login", target_type="user", target_id="2", via="password")
    AuditEntry.record_raw(staff, "node.drain", target_type="node", target_id="3", via="session")
    everything = api.get("/api/v1/audit/").json()["results"]
    assert [e["action"] for e in everything] == ["node.drain", "auth.login", "job.submit"]  # newest first
    assert [e["action"] for e in api.get("/api/v1/audit/", {"actor": "olivia"}).json()["results"]] == [
        "auth.login",
        "job.submit",
    ]
    assert [e["action"] for e in api.get("/api/v1/audit/", {"action": "auth."}).json()["results"]] == [
        "auth.login"
    ]
    assert [
        e["target_id"] for e in api.get("/api/v1/audit/", {"auth_method": "token"}).json()["results"]
    ] == ["1"]
    assert api.get("/api/v1/audit/", {"address": "not-an-ip"}).status_code == 400
    assert api.get("/api/v1/audit/", {"since": "2999-01-01T00:00:00Z"}).json()["results"] == []
    assert api.post("/api/v1/audit/", {}).status_code == 405  # read-only

    other = APIClient()
    other.force_login(operator)
    assert other.get("/api/v1/audit/").status_code == 403


def test_the_audit_page_is_for_staff_and_filters(client: Client, staff: User, operator: User) -> None:
    Job.objects.create(name="j", workload="digits-mlp")
    AuditEntry.record_raw(operator, "job.submit", target_type="job", target_id="41", via="token")
    AuditEntry.record_raw(staff, "node.drain", target_type="node", target_id="42", via="session")
    client.force_login(operator)
    assert client.get("/audit/").status_code == 403
    client.force_login(staff)
    page = client.get("/audit/", {"action": "job."})
    assert page.status_code == 200
    text = page.content.decode()
    assert "job.submit" in text and "node.drain" not in text
    assert client.get("/audit/", {"since": "yesterday"}).status_code == 400
    assert 'href="/audit/"' in client.get("/").content.decode()  # in the staff menu
