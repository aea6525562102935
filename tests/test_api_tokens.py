"""Personal API tokens: scopes, expiry, last use, revoke, create-or-replace, the password exchange
the CLI uses, and the tokens page under the user menu."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from console.api.models import ApiToken, hash_token
from console.core.models import AuditEntry

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_hashing(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_new_token_is_shown_once_and_stored_hashed(operator: User) -> None:
    created = session(operator).post(
        "/api/v1/tokens/",
        {"name": "ci", "scopes": ["read", "jobs:write"], "expires_in_days": 30},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    raw = body["token"]
    assert raw.startswith("ty_") and body["prefix"] == raw[:10]
    assert body["scopes"] == ["jobs:write", "read"]
    token = ApiToken.objects.get(pk=body["id"])
    assert token.key_hash == hash_token(raw) and raw not in {token.key_hash, token.prefix}
    assert token.expires_at is not None and token.expires_at - timezone.now() > timedelta(days=29)

    listed = session(operator).get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0]
    assert (
        AuditEntry.objects.filter(action="token.create", actor=operator, target_id=str(token.pk)).count() == 1
    )


def test_scopes_limit_a_token_to_what_they_name(operator: User) -> None:
    _, reader = ApiToken.issue(operator, "reader", ["read"])
    assert bearer(reader).get("/api/v1/jobs/").status_code == 200
    refused = bearer(reader).post("/api/v1/jobs/", {"name": "x", "workload": "digits-mlp"}, format="json")
    assert refused.status_code == 403 and "jobs:write" in refused.json()["detail"]

    _, writer = ApiToken.issue(operator, "writer", ["jobs:write"])
    assert (
        bearer(writer)
        .post("/api/v1/jobs/", {"name": "x", "workload": "digits-mlp"}, format="json")
        .status_code
        == 201
    )
    assert bearer(writer).get("/api/v1/jobs/").status_code == 403  # no read scope


def test_a_role_still_limits_a_token_with_every_scope(viewer: User) -> None:
    _, raw = ApiToken.issue(viewer, "all", ["read", "jobs:write", "nodes:write", "admin"])
    assert (
        bearer(raw).post("/api/v1/jobs/", {"name": "x", "workload": "digits-mlp"}, format="json").status_code
        == 403
    )
    assert bearer(raw).get("/api/v1/audit/").status_code == 403  # staff only


def test_expired_and_revoked_tokens_are_refused_with_the_reason(operator: User) -> None:
    expired, raw_expired = ApiToken.issue(
        operator, "old", ["read"], expires_at=timezone.now() + timedelta(seconds=1)
    )
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    answer = bearer(raw_expired).get("/api/v1/jobs/")
    assert answer.status_code == 401 and "expired" in answer.json()["detail"]

    token, raw = ApiToken.issue(operator, "gone", ["read"])
    assert session(operator).delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    answer = bearer(raw).get("/api/v1/jobs/")
    assert answer.status_code == 401 and "revoked" in answer.json()["detail"]
    assert AuditEntry.objects.filter(action="token.revoke", target_id=str(token.pk)).count() == 1
    failed = AuditEntry.objects.filter(action="auth.token_failed").order_by("id")
    assert [e.data["reason"] for e in failed] == ["expired", "revoked"]


def test_last_use_is_written_at_most_once_a_minute(operator: User) -> None:
    token, raw = ApiToken.issue(operator, "busy", ["read"])
    client = bearer(raw)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert client.get("/api/v1/tokens/current/").status_code == 200
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "api_apitoken"')]
    assert len(writes) == 1
    token.refresh_from_db()
    first_use = token.last_used_at
    assert first_use is not None and token.last_used_address == "127.0.0.1"

    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first_use - timedelta(seconds=61))
    client.get("/api/v1/tokens/current/")
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at > first_use - timedelta(seconds=1)


def test_a_name_in_use_is_refused_unless_replacing(operator: User) -> None:
    client = session(operator)
    first = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()
    clash = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert clash.status_code == 400 and "laptop" in clash.json()["errors"]["name"][0]
    second = client.post("/api/v1/tokens/", {"name": "laptop", "replace": True}, format="json").json()
    assert bearer(first["token"]).get("/api/v1/jobs/").status_code == 401
    assert bearer(second["token"]).get("/api/v1/jobs/").status_code == 200
    assert ApiToken.objects.filter(user=operator, name="laptop", revoked=False).count() == 1


def test_a_token_cannot_mint_a_token_with_more_scopes(operator: User) -> None:
    _, reader = ApiToken.issue(operator, "reader", ["read"])
    wider = bearer(reader).post("/api/v1/tokens/", {"name": "w", "scopes": ["jobs:write"]}, format="json")
    assert wider.status_code == 403  # managing tokens needs admin
    _, manager = ApiToken.issue(operator, "manager", ["jobs:write", "admin"])
    # admin implies every scope, so an admin token may mint any narrower one
    same = bearer(manager).post("/api/v1/tokens/", {"name": "w", "scopes": ["nodes:write"]}, format="json")
    assert same.status_code == 201


def test_the_current_token_can_be_read_and_revoked_by_itself(operator: User) -> None:
    token, raw = ApiToken.issue(operator, "cli-host", ["read"])
    current = bearer(raw).get("/api/v1/tokens/current/")
    assert current.status_code == 200 and current.json()["id"] == token.pk
    assert bearer(raw).delete("/api/v1/tokens/current/").status_code == 204
    token.refresh_from_db()
    assert token.revoked and token.revoked_at is not None
    assert bearer(raw).get("/api/v1/tokens/current/").status_code == 401
    assert session(operator).get("/api/v1/tokens/current/").status_code == 404  # a session has no token


def test_password_exchange_replaces_the_token_of_the_same_name(operator: User) -> None:
    body = {"username": "olivia", "password": "pw-operator-1", "name": "cli-box", "scopes": ["read"]}
    first = APIClient().post("/api/v1/auth/token/", body, format="json")
    assert first.status_code == 201, first.content
    second = APIClient().post("/api/v1/auth/token/", body, format="json")
    assert second.status_code == 201
    live = ApiToken.objects.filter(user=operator, revoked=False)
    assert [t.pk for t in live] == [second.json()["id"]]
    assert bearer(first.json()["token"]).get("/api/v1/jobs/").status_code == 401

    wrong = APIClient().post("/api/v1/auth/token/", {**body, "password": "nope"}, format="json")
    assert wrong.status_code == 401 and wrong.json()["detail"] == "Wrong username or password."
    assert wrong.has_header("WWW-Authenticate")
    missing = APIClient().post("/api/v1/auth/token/", {"name": "x"}, format="json")
    assert missing.status_code == 400 and {"username", "password"} <= set(missing.json()["errors"])


def test_the_tokens_page_creates_shows_once_and_revokes(operator: User) -> None:
    web = Client()
    web.force_login(operator)
    page = web.get("/account/tokens/")
    assert page.status_code == 200 and b"No tokens yet" in page.content

    made = web.post(
        "/account/tokens/", {"action": "create", "name": "notebook", "scopes": ["read", "jobs:write"]}
    )
    assert made.status_code == 200
    token = ApiToken.objects.get(user=operator, name="notebook")
    raw = made.context["created"]["raw"]
    assert raw.encode() in made.content and token.key_hash == hash_token(raw)
    assert raw.encode() not in web.get("/account/tokens/").content  # shown once

    invalid = web.post("/account/tokens/", {"action": "create", "name": "bad/name", "scopes": ["read"]})
    assert invalid.status_code == 400 and ApiToken.objects.filter(user=operator).count() == 1

    other = User.objects.create_user("mallory", password="pw-mallory-1")
    theirs, _ = ApiToken.issue(other, "theirs", ["read"])
    assert web.post("/account/tokens/", {"action": "revoke", "token": theirs.pk}).status_code == 404
    web.post("/account/tokens/", {"action": "revoke", "token": token.pk})
    token.refresh_from_db()
    theirs.refresh_from_db()
    assert token.revoked and not theirs.revoked
    assert b"/account/tokens/" in web.get("/").content  # linked from the user menu
