"""/ws/jobs/<id>/ over the real Redis channel layer: resume, live frames, malformed input, auth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User

from console.asgi import application
from console.jobs.models import Job
from console.telemetry.events import emit
from console.telemetry.ingest.broadcast import Broadcaster
from console.telemetry.ingest.frames import FRAME_POINTS
from console.telemetry.models import Event
from tests.support.telemetry import allocate, batch, ingest_loop, metric_records, session_cookie, xadd
from workers.protocol import TELEMETRY_STREAM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ORIGIN = (b"origin", b"http://localhost")


def communicator(path: str, cookie: str | None) -> WebsocketCommunicator:
    headers = [ORIGIN]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def receive(comm: WebsocketCommunicator, timeout: float = 5) -> dict[str, Any]:
    return json.loads(await comm.receive_from(timeout))


async def close_code(comm: WebsocketCommunicator, timeout: float = 5) -> int:
    while True:
        output = await comm.receive_output(timeout)
        if output["type"] == "websocket.close":
            return int(output["code"])


async def collect_events(comm: WebsocketCommunicator, until: Callable[[list[int]], bool]) -> list[int]:
    seqs: list[int] = []
    while not until(seqs):
        message = await receive(comm)
        if message["type"] == "event":
            assert message["seq"] == message["event"]["seq"]
            seqs.append(message["seq"])
    return seqs


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


@pytest.fixture
def job() -> Job:
    job = Job.objects.create(name="ws", workload="mlp", round_number=1)
    allocate(job)
    return job


@pytest.fixture
def cookie(viewer: User) -> str:
    return session_cookie(viewer)


@pytest.fixture
def stream() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(TELEMETRY_STREAM)
    yield client
    client.delete(TELEMETRY_STREAM)
    client.close()


def emit_many(job: Job, n: int, label: str) -> list[int]:
    return [emit("note", f"{label} {i}", job=job).pk for i in range(n)]


def test_resuming_client_gets_exactly_what_it_missed_then_live(job: Job, cookie: str) -> None:
    emit_many(job, 3, "before")

    async def scenario() -> None:
        # Given a viewer that read the backlog and one live event, then disconnected
        first = communicator(f"/ws/jobs/{job.pk}/", cookie)
        assert (await first.connect())[0]
        assert (await receive(first))["type"] == "state"
        await first.send_json_to({"type": "resume", "after": 0})
        seen = await collect_events(first, lambda s: len(s) == 3)
        live = await database_sync_to_async(emit_many)(job, 1, "live")
        seen += await collect_events(first, lambda s: len(s) == 1)
        await first.disconnect()
        assert seen == sorted(seen) and seen[-1] == live[0]

        # When events happen while it is away and it reconnects with its last seq, while more
        # events are emitted concurrently with its resume
        missed = await database_sync_to_async(emit_many)(job, 5, "away")
        second = communicator(f"/ws/jobs/{job.pk}/", cookie)
        assert (await second.connect())[0]
        assert (await receive(second))["type"] == "state"
        await second.send_json_to({"type": "resume", "after": seen[-1]})
        during = asyncio.create_task(database_sync_to_async(emit_many)(job, 20, "during"))
        concurrent = await during
        resumed = await collect_events(second, lambda s: len(s) >= len(missed) + len(concurrent))

        # Then it got every event after its seq exactly once: the missed ones first, then live
        assert resumed[: len(missed)] == missed
        assert sorted(resumed) == missed + concurrent
        assert len(set(resumed)) == len(resumed)
        # and no further event: one emitted now is the next event it gets (not a wait for
        # silence; events reach a viewer in order)
        [last] = await database_sync_to_async(emit_many)(job, 1, "barrier")
        assert await collect_events(second, lambda s: len(s) >= 1) == [last], "duplicate event after resume"
        await second.disconnect()

    run(scenario)
    stored = list(Event.objects.filter(job=job).values_list("pk", flat=True).order_by("pk"))
    assert len(stored) == 3 + 1 + 5 + 20 + 1


def test_live_frames_are_coalesced_and_display_sized(job: Job, cookie: str, stream: redis.Redis) -> None:
    xadd(stream, batch(job.pk, metric_records(range(2000), {"loss": lambda s: float(s % 97), "lr": 0.1})))
    xadd(stream, batch(job.pk, metric_records(range(2000)), rank=1))
    xadd(stream, batch(job.pk, [{"kind": "log", "seq": 1, "t": 1.0, "stream": "stdout", "text": "epoch 1"}]))

    async def scenario() -> None:
        comm = communicator(f"/ws/jobs/{job.pk}/", cookie)
        assert (await comm.connect())[0]
        assert (await receive(comm))["type"] == "state"
        broadcaster = Broadcaster()

        def ingest_all() -> None:
            with ingest_loop(stream, "ws-test", sink=broadcaster) as loop:
                loop.drain()

        await database_sync_to_async(ingest_all)()
        await asyncio.get_running_loop().run_in_executor(None, broadcaster.close)
        got: dict[str, dict[str, Any]] = {}
        while "metrics" not in got or "log" not in got:
            message = await receive(comm)
            got[message["type"]] = message
        await comm.disconnect()

        # One frame carries rank 0's 2000 steps thinned to display size, extremes and last kept
        series = got["metrics"]["series"]
        assert set(series) == {"loss", "lr"}
        loss = series["loss"]
        assert len(loss) <= FRAME_POINTS
        assert loss[-1] == [1999, float(1999 % 97)]
        assert max(v for _, v in loss) == 96.0 and min(v for _, v in loss) == 0.0
        assert got["metrics"]["round"] == 1
        assert [line["text"] for line in got["log"]["lines"]] == ["epoch 1"]

    run(scenario)


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({"type": "subscribe"}),
        json.dumps({"type": "resume", "after": "12"}),
        json.dumps({"type": "resume", "after": -1}),
        json.dumps(["resume"]),
        json.dumps({"type": "ping", "pad": "x" * 5000}),
    ],
)
def test_malformed_message_closes_that_socket_only(job: Job, cookie: str, bad: str) -> None:
    async def scenario() -> None:
        rude = communicator(f"/ws/jobs/{job.pk}/", cookie)
        polite = communicator(f"/ws/jobs/{job.pk}/", cookie)
        for comm in (rude, polite):
            assert (await comm.connect())[0]
            assert (await receive(comm))["type"] == "state"

        await rude.send_to(text_data=bad)
        assert await close_code(rude) == 4400

        await polite.send_json_to({"type": "ping"})
        assert await receive(polite) == {"type": "pong"}
        [seq] = await database_sync_to_async(emit_many)(job, 1, "after")
        message = await receive(polite)
        assert (message["type"], message["seq"]) == ("event", seq)
        await polite.disconnect()

    run(scenario)


def test_binary_message_closes_with_4400(job: Job, cookie: str) -> None:
    async def scenario() -> None:
        comm = communicator(f"/ws/jobs/{job.pk}/", cookie)
        assert (await comm.connect())[0]
        await receive(comm)
        await comm.send_to(bytes_data=b"\x00\x01")
        assert await close_code(comm) == 4400

    run(scenario)


def test_anonymous_unknown_job_and_foreign_origin_are_refused(job: Job, cookie: str) -> None:
    async def scenario() -> None:
        for path in (f"/ws/jobs/{job.pk}/", "/ws/cluster/"):
            anonymous = communicator(path, None)
            assert (await anonymous.connect())[0]
            assert await close_code(anonymous) == 4401

        for missing_id in (job.pk + 999, 10**30):
            missing = communicator(f"/ws/jobs/{missing_id}/", cookie)
            assert (await missing.connect())[0]
            assert await close_code(missing) == 4404

        forged = WebsocketCommunicator(
            application,
            f"/ws/jobs/{job.pk}/",
            headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie.encode())],
        )
        connected, _ = await forged.connect()
        assert not connected

    run(scenario)


def test_inactive_user_is_refused(job: Job, viewer: User) -> None:
    cookie = session_cookie(viewer)
    User.objects.filter(pk=viewer.pk).update(is_active=False)

    async def scenario() -> None:
        comm = communicator(f"/ws/jobs/{job.pk}/", cookie)
        assert (await comm.connect())[0]
        assert await close_code(comm) == 4401

    run(scenario)
