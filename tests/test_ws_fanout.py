"""Live metric frames through the per-process FrameHub over real Redis pub/sub: every viewer of
a job gets every frame in order from one subscription, and a stalled viewer holds up no one."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User

from console.asgi import application
from console.jobs.models import Job
from console.telemetry.fanout import BUSY_VIEWERS, FrameHub, busy_key, frame_channel, get_hub
from console.telemetry.ingest.broadcast import Broadcaster
from console.telemetry.ingest.loop import IngestLoop
from tests.support.telemetry import allocate, batch, metric_records, session_cookie, xadd
from workers.protocol import TELEMETRY_STREAM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

VIEWERS = 20
FRAMES = 12
STEPS_PER_FRAME = 50


@pytest.fixture
def job() -> Job:
    job = Job.objects.create(name="fanout", workload="mlp", round_number=1)
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


def subscribers(client: redis.Redis, channel: str) -> int:
    [(_, count)] = client.pubsub_numsub(channel)
    return int(count)


def test_every_viewer_gets_every_frame_in_order_from_one_subscription(
    job: Job, cookie: str, stream: redis.Redis
) -> None:
    db = int(stream.connection_pool.connection_kwargs.get("db") or 0)
    channel = frame_channel(job.pk, db)

    async def scenario() -> None:
        comms = [
            WebsocketCommunicator(
                application,
                f"/ws/jobs/{job.pk}/",
                headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
            )
            for _ in range(VIEWERS)
        ]
        for comm in comms:
            assert (await comm.connect())[0]
            assert json.loads(await comm.receive_from(5))["type"] == "state"
        # Twenty local viewers, one Redis subscription.
        assert get_hub().viewers(job.pk) == VIEWERS
        assert subscribers(stream, channel) == 1

        broadcaster = Broadcaster()

        def ingest_frames() -> None:
            loop = IngestLoop(stream, "fanout-test", sink=broadcaster)
            for k in range(FRAMES):
                steps = range(k * STEPS_PER_FRAME, (k + 1) * STEPS_PER_FRAME)
                xadd(stream, batch(job.pk, metric_records(steps, {"loss": lambda s: float(s)})))
                loop.drain()
                loop.flush_frames(force=True)
            loop.close()

        await database_sync_to_async(ingest_frames)()
        await asyncio.get_running_loop().run_in_executor(None, broadcaster.close)

        for comm in comms:
            frames: list[int] = []
            last_steps: list[int] = []
            while len(frames) < FRAMES:
                message = json.loads(await comm.receive_from(10))
                assert message["type"] != "gap"
                if message["type"] == "metrics":
                    frames.append(message["frame"])
                    last_steps.append(message["series"]["loss"][-1][0])
            # Every frame, in order, each ending with the newest step ingested before it.
            assert frames == list(range(1, FRAMES + 1))
            assert last_steps == [(k + 1) * STEPS_PER_FRAME - 1 for k in range(FRAMES)]

        # and nothing after them (not a wait: a last frame published now is the next message of
        # every viewer; one frame is delivered to all viewers in publication order)
        stream.publish(channel, json.dumps({"type": "metrics", "frame": "barrier", "series": {}}))
        for comm in comms:
            assert json.loads(await comm.receive_from(10))["frame"] == "barrier"

        for comm in comms[:-1]:
            await comm.disconnect()
        assert get_hub().viewers(job.pk) == 1
        assert subscribers(stream, channel) == 1
        await comms[-1].disconnect()
        # The last viewer leaving ends the job's subscription.
        assert get_hub().viewers(job.pk) == 0
        deadline = time.monotonic() + 5
        while subscribers(stream, channel) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert subscribers(stream, channel) == 0

    asyncio.run(scenario())


def test_a_stalled_viewer_delays_no_one_and_is_told_what_it_missed() -> None:
    capacity = 4
    frames = 60
    job_id = 987_654

    async def scenario() -> None:
        hub = FrameHub(settings.REDIS_URL, capacity=capacity)
        db = int(hub.client.connection_pool.connection_kwargs.get("db") or 0)
        publisher = redis.Redis.from_url(settings.REDIS_URL)
        got: list[list[dict[str, Any]]] = [[] for _ in range(5)]
        arrival: list[float] = []
        stalled_got: list[dict[str, Any]] = []
        release = asyncio.Event()

        def fast(into: list[dict[str, Any]]) -> Any:
            async def send(text: str) -> None:
                into.append(json.loads(text))
                if into is got[0]:
                    arrival.append(time.monotonic())

            return send

        async def stalled(text: str) -> None:
            # A socket whose peer stopped reading: the send does not return until released.
            await release.wait()
            stalled_got.append(json.loads(text))

        try:
            viewers = [await hub.join(job_id, fast(into)) for into in got]
            slow = await hub.join(job_id, stalled)
            sent_at = []
            for n in range(1, frames + 1):
                sent_at.append(time.monotonic())
                publisher.publish(frame_channel(job_id, db), json.dumps({"type": "metrics", "frame": n}))
                await asyncio.sleep(0.005)
            deadline = time.monotonic() + 10
            while any(len(g) < frames for g in got) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

            # The fast viewers got every frame, in order, while the stalled one sat blocked.
            for into in got:
                assert [m["frame"] for m in into] == list(range(1, frames + 1))
            assert not stalled_got
            # ...and promptly: within a second of its publication, on a loaded machine.
            assert max(a - s for a, s in zip(arrival, sent_at, strict=True)) < 1.0
            assert slow.dropped > 0

            # Once it drains, it gets what its queue held, a gap notice, then live frames again.
            release.set()
            while len(stalled_got) < capacity + 1:
                await asyncio.sleep(0.01)
            publisher.publish(frame_channel(job_id, db), json.dumps({"type": "metrics", "frame": frames + 1}))
            deadline = time.monotonic() + 5
            while (
                not stalled_got or stalled_got[-1].get("frame") != frames + 1
            ) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            kinds = [m["type"] for m in stalled_got]
            assert kinds.count("gap") == 1
            gap = stalled_got[kinds.index("gap")]
            held = [m["frame"] for m in stalled_got if m["type"] == "metrics"]
            assert held[-1] == frames + 1
            # Frames it received plus frames it was told it missed account for every frame.
            assert len(held) + gap["dropped"] == frames + 1
            assert held == sorted(held)
            for viewer in [*viewers, slow]:
                await hub.leave(job_id, viewer)
            assert hub.viewers(job_id) == 0
        finally:
            await hub.close()
            publisher.close()

    asyncio.run(scenario())


def test_many_viewers_flag_the_job_busy_and_ingest_then_sends_fewer_frames(
    job: Job, stream: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = busy_key(job.pk)
    stream.delete(key)

    async def many_viewers() -> None:
        hub = FrameHub(settings.REDIS_URL)
        try:

            async def send(text: str) -> None:
                return None

            viewers = [await hub.join(job.pk, send) for _ in range(BUSY_VIEWERS - 1)]
            # (not a sleep: the feed checks its viewers before each read; two frames delivered
            # means it checked at least once with all of them there)
            feed = hub.feeds[job.pk]
            channel = frame_channel(job.pk, int(stream.connection_pool.connection_kwargs.get("db") or 0))
            for frame in (1, 2):
                stream.publish(channel, json.dumps({"type": "metrics", "frame": frame}))
                deadline = time.monotonic() + 10
                while feed.frames < frame and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert feed.frames == frame
            assert not stream.exists(key)
            viewers.append(await hub.join(job.pk, send))
            deadline = time.monotonic() + 5
            while not stream.exists(key) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert stream.exists(key)
            assert 0 < int(stream.ttl(key)) <= 5
            for viewer in viewers:
                await hub.leave(job.pk, viewer)
        finally:
            await hub.close()

    asyncio.run(many_viewers())

    # Ingest, told the job is busy, holds a frame back within the busy interval (the points are
    # not lost: the next frame carries them), and numbers frames without gaps.
    monkeypatch.setattr("console.telemetry.ingest.frames.BUSY_FRAME_INTERVAL", 60.0)
    db = int(stream.connection_pool.connection_kwargs.get("db") or 0)
    listener = stream.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(frame_channel(job.pk, db))
    broadcaster = Broadcaster()
    loop = IngestLoop(stream, "busy-test", sink=broadcaster, frame_interval=0.0)
    try:
        published: list[dict[str, Any]] = []

        def ingest(steps: range, force: bool = False) -> None:
            xadd(stream, batch(job.pk, metric_records(steps, {"loss": lambda s: float(s)})))
            loop.drain()
            loop.flush_frames(force=force)

        def drain(until: int) -> None:
            deadline = time.monotonic() + 5
            while len(published) < until and time.monotonic() < deadline:
                message = listener.get_message(timeout=0.1)
                if message is not None:
                    published.append(json.loads(message["data"]))

        stream.set(key, 1, ex=30)
        ingest(range(0, 10))
        drain(1)
        ingest(range(10, 20))
        ingest(range(20, 30))
        drain(2)
        assert [f["frame"] for f in published] == [1]
        assert published[0]["series"]["loss"][-1][0] == 9
        ingest(range(30, 40), force=True)
        drain(2)
        assert [f["frame"] for f in published] == [1, 2]
        assert [s for s, _ in published[1]["series"]["loss"]][-1] == 39
        assert published[1]["series"]["loss"][0][0] == 10
    finally:
        loop.close()
        broadcaster.close()
        listener.close()
        stream.delete(key)
