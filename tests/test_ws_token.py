"""Bearer tokens on /ws/jobs/<id>/ (console/api/ws_auth.py), over the real Redis channel layer:
a token with ``read`` is accepted without a session or an Origin check, refused tokens close with
their code and reason and count as failed attempts, and the Origin check still guards cookies."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.utils import timezone

from console.api.models import ApiToken, Scope
from console.asgi import application
from console.core.models import AuditEntry
from console.jobs.models import Job
from console.telemetry.events import emit
from tests.support.telemetry import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

LIMIT = 3


@pytest.fixture(autouse=True)
def small_limit(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT


@pytest.fixture
def job() -> Job:
    return Job.objects.create(name="ws-token", workload="mlp", round_number=1)


def connect_with(
    path: str, headers: list[tuple[bytes, bytes]], address: str = "10.0.0.7"
) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, path, headers=headers)
    comm.scope["client"] = (address, 40000)
    return comm


def bearer(raw: str) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {raw}".encode())


async def closed_with(comm: WebsocketCommunicator) -> tuple[int, str]:
    connected, _ = await comm.connect()
    assert connected  # accepted, then closed with a code the client can read
    while True:
        output = await comm.receive_output(5)
        if output["type"] == "websocket.close":
            return int(output["code"]), str(output.get("reason", ""))


def test_a_read_token_follows_a_job_without_session_or_origin(job: Job, viewer: User) -> None:
    token, raw = ApiToken.issue(viewer, "cli", scopes=[Scope.READ])

    async def scenario() -> None:
        # No Origin header at all, and a foreign one: neither matters to a token
        for headers in ([bearer(raw)], [bearer(raw), (b"origin", b"http://evil.example")]):
            comm = connect_with(f"/ws/jobs/{job.pk}/", headers)
            assert (await comm.connect())[0]
            hello = json.loads(await comm.receive_from(5))
            assert hello["type"] == "state" and hello["job"]["id"] == job.pk
            event = await database_sync_to_async(emit)("note", "over the channel layer", job=job)
            while True:
                message = json.loads(await comm.receive_from(5))
                if message["type"] == "event":
                    break
            assert message["seq"] == event.pk
            await comm.disconnect()

    asyncio.run(scenario())
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_refused_tokens_close_with_their_code_and_are_audited(job: Job, viewer: User) -> None:
    _, write_only = ApiToken.issue(viewer, "writer", scopes=[Scope.JOBS_WRITE])
    revoked, revoked_raw = ApiToken.issue(viewer, "old")
    revoked.revoke()
    _, expired_raw = ApiToken.issue(viewer, "late", expires_at=timezone.now() - timedelta(minutes=1))
    _, good = ApiToken.issue(viewer, "good", scopes=[Scope.READ])
    path = f"/ws/jobs/{job.pk}/"

    async def scenario() -> None:
        # A token without read: forbidden (not a failed attempt: the token is genuine)
        assert await closed_with(connect_with(path, [bearer(write_only)], "10.0.0.1")) == (
            4403,
            "This token lacks the 'read' scope.",
        )
        # Unknown, revoked and expired tokens, each from its own address
        assert await closed_with(connect_with(path, [bearer("ty_nonsense")], "10.0.0.2")) == (
            4401,
            "Invalid API token.",
        )
        assert await closed_with(connect_with(path, [bearer(revoked_raw)], "10.0.0.3")) == (
            4401,
            "This API token was revoked.",
        )
        assert await closed_with(connect_with(path, [bearer(expired_raw)], "10.0.0.4")) == (
            4401,
            "This API token has expired.",
        )
        code, _ = await closed_with(connect_with(path, [(b"authorization", b"Basic abc")], "10.0.0.5"))
        assert code == 4401
        # Repeated failures from one address never refuse a good token there
        for _ in range(LIMIT):
            await closed_with(connect_with(path, [bearer("ty_guess")], "10.0.0.6"))
        ok = connect_with(path, [bearer(good)], "10.0.0.6")
        assert (await ok.connect())[0]
        assert json.loads(await ok.receive_from(5))["type"] == "state"
        await ok.disconnect()

    asyncio.run(scenario())
    failed = AuditEntry.objects.filter(action="auth.token_failed")
    assert set(failed.values_list("data__reason", flat=True)) >= {"unknown", "revoked", "expired"}
    assert set(failed.values_list("source_address", flat=True)) >= {"10.0.0.2", "10.0.0.3", "10.0.0.4"}
    assert not AccessAttempt.objects.exists()  # tokens are not subject to the sign-in lockout


def test_a_cookie_still_needs_the_right_origin(job: Job, viewer: User) -> None:
    cookie = (b"cookie", session_cookie(viewer).encode())

    async def scenario() -> None:
        forged = connect_with(f"/ws/jobs/{job.pk}/", [(b"origin", b"http://evil.example"), cookie])
        assert not (await forged.connect())[0]
        good = connect_with(f"/ws/jobs/{job.pk}/", [(b"origin", b"http://localhost"), cookie])
        assert (await good.connect())[0]
        assert json.loads(await good.receive_from(5))["type"] == "state"
        await good.disconnect()

    asyncio.run(scenario())
