"""Process-local fan-out of live metric frames to a job's websocket viewers.

Ingest serialises each metric frame once and PUBLISHes it to the job's Redis pub/sub channel
(``frame_channel``). In each web process a ``FrameHub`` keeps one subscription per job that has
local viewers, and hands every frame to each of them. Through the channel layer the same frame
became one Redis message, one msgpack round trip and one consumer wake-up per viewer; here it is
one Redis message per web process, whatever the number of viewers: coalesced, display-sized
frames per job.

Each viewer has a bounded queue and its own sender task, so one slow socket never holds back the
others: when its queue is full the frame is dropped for that viewer only, and the viewer is told
(``{"type": "gap", "dropped": n}``) before its next frame. Viewers that keep up see every frame,
in order. Pub/sub keeps nothing for absent subscribers, so ``join`` returns only once the job's
subscription is confirmed: a frame published after that reaches the new viewer.

A job with BUSY_VIEWERS or more viewers in one process is flagged in Redis (``busy_key``, with a
short expiry the feed renews); ingest then sends its frames every BUSY_FRAME_INTERVAL instead of
every FRAME_INTERVAL, because each frame costs this process one send per viewer.

Events, state changes and log lines stay on the channel layer's ``job.<id>`` groups; they are
rare and need the layer's per-consumer delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# Frames a viewer may have waiting. At a few frames per second this is several seconds of frames:
# a browser that falls further behind than that is better served by dropping than by lagging.
VIEWER_QUEUE = 32
# How long ``join`` waits for the job's subscription. Past it the viewer is attached anyway and
# gets frames once Redis answers (it only misses frames published before that).
SUBSCRIBE_TIMEOUT = 5.0
# How often the reader checks for cancellation while no frame arrives, and the back-off bounds
# after losing Redis.
POLL_SECONDS = 1.0
RETRY_MIN = 0.2
RETRY_MAX = 2.0
# With this many local viewers of a job the hub asks ingest for fewer frames of it (see
# ingest.BUSY_FRAME_INTERVAL): each frame costs the web process one send per viewer. The flag
# expires unless renewed, so a web process that dies does not leave it set. 200 viewers kept up
# with 10 frames/s on this 2-core machine (ingest.BUSY_FRAME_INTERVAL); this is the safety valve
# beyond what was measured.
BUSY_VIEWERS = 500
BUSY_TTL = 5
BUSY_RENEW = 2.0

Send = Callable[[str], Awaitable[None]]


def frame_channel(job_id: int, db: int = 0) -> str:
    # Pub/sub channels ignore the database number; naming it keeps consoles (and test runs) that
    # share one Redis server on different databases apart.
    return f"trainyard:{db}:frames:{job_id}"


def busy_key(job_id: int) -> str:
    return f"trainyard:frames-busy:{job_id}"


def redis_db(client: aioredis.Redis) -> int:
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


class Viewer:
    """One websocket's share of a job feed: a bounded queue drained by its own task."""

    def __init__(self, send: Send, capacity: int) -> None:
        self.send = send
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=capacity)
        self.dropped = 0
        self.delivered = 0
        self.task = asyncio.create_task(self._run())

    def offer(self, text: str) -> None:
        if self.dropped:
            # After a drop, later frames wait until the queue has room for the gap notice too.
            if self.queue.maxsize - self.queue.qsize() < 2:
                self.dropped += 1
                return
            self.queue.put_nowait(json.dumps({"type": "gap", "dropped": self.dropped}))
            self.dropped = 0
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            text = await self.queue.get()
            try:
                await self.send(text)
            except asyncio.CancelledError:
                raise
            except Exception:  # a socket that broke mid-send; its consumer's disconnect removes it
                log.debug("frame send to a viewer failed", exc_info=True)
                return
            self.delivered += 1

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class JobFeed:
    """The one subscription of this process to a job's frames, and the viewers it serves."""

    def __init__(self, hub: FrameHub, job_id: int) -> None:
        self.hub = hub
        self.job_id = job_id
        self.viewers: list[Viewer] = []
        self.subscribed = asyncio.Event()
        self.frames = 0
        self.task = asyncio.create_task(self._run(), name=f"frames-{job_id}")

    def deliver(self, text: str) -> None:
        self.frames += 1
        for viewer in self.viewers:
            viewer.offer(text)

    async def _run(self) -> None:
        delay = RETRY_MIN
        channel = frame_channel(self.job_id, redis_db(self.hub.client))
        while True:
            pubsub = self.hub.client.pubsub()
            try:
                await pubsub.subscribe(channel)
                # Viewers are told we are live only once Redis confirms the subscription: frames
                # published from then on reach them.
                while True:
                    message = await pubsub.get_message(timeout=POLL_SECONDS)
                    if message is not None and message["type"] == "subscribe":
                        break
                self.subscribed.set()
                delay = RETRY_MIN
                renewed = 0.0
                while True:
                    now = time.monotonic()
                    if len(self.viewers) >= BUSY_VIEWERS and now - renewed >= BUSY_RENEW:
                        renewed = now
                        await self.hub.client.set(busy_key(self.job_id), 1, ex=BUSY_TTL)
                    message = await pubsub.get_message(timeout=POLL_SECONDS)
                    if message is not None and message["type"] == "message":
                        data = message["data"]
                        self.deliver(data.decode() if isinstance(data, bytes) else str(data))
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("frame subscription for job %s lost (%s); retrying", self.job_id, exc)
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
            except Exception:
                # Anything else would end the feed silently and leave its viewers without frames.
                log.exception("frame subscription for job %s failed; retrying", self.job_id)
                await asyncio.sleep(RETRY_MAX)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class FrameHub:
    """Per event loop (one per web process): job feeds started by the first local viewer of a job
    and stopped when its last viewer leaves."""

    def __init__(self, redis_url: str, capacity: int = VIEWER_QUEUE) -> None:
        self.client = aioredis.Redis.from_url(redis_url, socket_timeout=30, socket_connect_timeout=5)
        self.capacity = capacity
        self.feeds: dict[int, JobFeed] = {}

    async def join(self, job_id: int, send: Send) -> Viewer:
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = JobFeed(self, job_id)
        viewer = Viewer(send, self.capacity)
        feed.viewers.append(viewer)
        try:
            await asyncio.wait_for(feed.subscribed.wait(), SUBSCRIBE_TIMEOUT)
        except TimeoutError:
            log.warning("no frame subscription for job %s yet; viewer attached anyway", job_id)
        return viewer

    async def leave(self, job_id: int, viewer: Viewer) -> None:
        feed = self.feeds.get(job_id)
        if feed is not None and viewer in feed.viewers:
            feed.viewers.remove(viewer)
            if not feed.viewers:
                del self.feeds[job_id]
                await feed.stop()
        await viewer.stop()

    def viewers(self, job_id: int) -> int:
        feed = self.feeds.get(job_id)
        return len(feed.viewers) if feed else 0

    async def close(self) -> None:
        feeds, self.feeds = list(self.feeds.values()), {}
        for feed in feeds:
            await feed.stop()
            for viewer in feed.viewers:
                await viewer.stop()
        await self.client.aclose()


_hubs: dict[asyncio.AbstractEventLoop, FrameHub] = {}


def get_hub() -> FrameHub:
    """This event loop's hub. Daphne runs one loop per process; tests start one per test, and a
    hub's Redis connections belong to the loop that made them."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        for old in [other for other in _hubs if other.is_closed()]:
            del _hubs[old]
        hub = _hubs[loop] = FrameHub(settings.REDIS_URL)
    return hub
