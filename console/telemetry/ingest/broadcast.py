"""Broadcasting: live frames out of ingest, from a private event loop so that Redis never
stalls the database writes.

A frame's metrics are PUBLISHed once to the job's Redis pub/sub channel, where each web
process's FrameHub (console.telemetry.fanout) hands them to all of its viewers of that job; its
log tail goes to the job's channel-layer group. Delivery is best effort: the database is the
record, and a viewer that missed something fetches it from the API.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings

from console.telemetry.events import job_group
from console.telemetry.fanout import frame_channel, redis_db
from console.telemetry.ingest.frames import Frame

log = logging.getLogger(__name__)


class Broadcaster:
    """Sends frames from one long-lived event loop thread. ``async_to_sync`` would start a loop
    per call, and channels-redis keeps a connection pool per loop; one loop keeps one pool and
    never blocks the caller."""

    def __init__(self, redis_url: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ingest-broadcast", daemon=True)
        self.thread.start()
        self.pending: list[Future[None]] = []
        self.redis = aioredis.Redis.from_url(
            redis_url or settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5
        )
        # Frames of one job must reach subscribers in order; publishes could otherwise overtake
        # each other on different pooled connections. Created on the loop that uses it.
        self.publish_lock = asyncio.run_coroutine_threadsafe(self._make_lock(), self.loop).result()

    @staticmethod
    async def _make_lock() -> asyncio.Lock:
        return asyncio.Lock()

    def deliver(self, frame: Frame) -> None:
        if frame.metrics is not None:
            self.publish(frame_channel(frame.job_id, redis_db(self.redis)), frame.metrics)
        if frame.log is not None:
            self.send(job_group(frame.job_id), {"type": "job.frame", "frame": frame.number, "log": frame.log})

    def publish(self, channel: str, text: str) -> None:
        """One PUBLISH per frame, whatever the number of viewers (see console.telemetry.fanout)."""
        self._track(asyncio.run_coroutine_threadsafe(self._publish(channel, text), self.loop))

    def send(self, group: str, message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        self._track(asyncio.run_coroutine_threadsafe(self._send(layer, group, message), self.loop))

    def _track(self, future: Future[None]) -> None:
        self.pending = [f for f in self.pending if not f.done()]
        self.pending.append(future)

    async def _send(self, layer: Any, group: str, message: dict[str, Any]) -> None:
        try:
            await layer.group_send(group, message)
        except Exception:  # the database is the record; live delivery is best effort
            log.warning("frame to %s failed", group, exc_info=True)

    async def _publish(self, channel: str, text: str) -> None:
        try:
            async with self.publish_lock:
                await self.redis.publish(channel, text)
        except Exception:  # as above: viewers catch up from the database on resume
            log.warning("frame to %s failed", channel, exc_info=True)

    def close(self, timeout: float = 2.0) -> None:
        """Wait (up to ``timeout``) for what is on its way, then stop the loop."""
        deadline = time.monotonic() + timeout
        for fut in self.pending:
            try:
                fut.result(max(0.0, deadline - time.monotonic()))
            except Exception:
                log.debug("frame not sent before shutdown", exc_info=True)
        try:
            asyncio.run_coroutine_threadsafe(self.redis.aclose(), self.loop).result(
                max(0.1, deadline - time.monotonic())
            )
        except Exception:
            log.debug("frame publisher not closed cleanly", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)


class Discard:
    """A sink that drops every frame: for an ingest whose callers look only at what it stores."""

    def deliver(self, frame: Frame) -> None:
        return None
