"""``manage.py ingest``: the telemetry ingest daemon (see console.telemetry.ingest)."""

from __future__ import annotations

import logging
import signal
import socket
import time
from types import FrameType
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from console.telemetry.ingest import FRAME_INTERVAL, Broadcaster, Ingestor, Pipeline

log = logging.getLogger("console.telemetry.ingest")

# Back-off after a Redis or database failure: long enough not to spin, short enough that a
# restarted Redis is noticed within a second or two.
RETRY_MIN = 0.2
RETRY_MAX = 2.0


class Command(BaseCommand):
    help = "Consume agent telemetry from Redis into PostgreSQL and broadcast live frames."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--consumer",
            default=f"ingest-{socket.gethostname()}",
            help="Consumer name in the group; keep it stable so a restart re-reads its pending entries.",
        )
        parser.add_argument(
            "--frame-interval",
            type=float,
            default=FRAME_INTERVAL,
            help="Seconds between live frames per job (more viewers per web process may want longer).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5)
        broadcaster = Broadcaster()
        ingestor = Ingestor(
            client, options["consumer"], broadcaster=broadcaster, frame_interval=options["frame_interval"]
        )
        log.info("ingest %s consuming %s", options["consumer"], ingestor.stream)
        pipeline = Pipeline(ingestor)
        delay = RETRY_MIN
        group_ready = False
        try:
            while not self.stopping:
                try:
                    error = pipeline.take_error()
                    if error is not None:
                        raise error
                    if not group_ready:
                        ingestor.ensure_group()
                        group_ready = True
                    entries = ingestor.read()
                    if entries:
                        pipeline.submit(ingestor.take(entries))
                    ingestor.maybe_flush()
                    ingestor.maybe_report_stats()
                    ingestor.maybe_trim()
                    delay = RETRY_MIN
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
                    self._after_failure(ingestor, pipeline, delay)
                    # A restarted Redis without persistence has no group; make it again.
                    group_ready = False
                    delay = min(RETRY_MAX, delay * 2)
                except redis.ResponseError as exc:
                    if "NOGROUP" in str(exc):
                        group_ready = False
                    log.warning("redis error (%s); retrying in %.1fs", exc, delay)
                    self._after_failure(ingestor, pipeline, delay)
                    delay = min(RETRY_MAX, delay * 2)
                except Exception:
                    log.exception("ingest pass failed; its entries stay pending and are retried")
                    close_old_connections()
                    self._after_failure(ingestor, pipeline, delay)
                    delay = min(RETRY_MAX, delay * 2)
        finally:
            pipeline.close()
            ingestor.maybe_flush(force=True)
            broadcaster.close()
            log.info("ingest %s stopped", options["consumer"])

    def _after_failure(self, ingestor: Ingestor, pipeline: Pipeline, delay: float) -> None:
        # Whatever was queued behind the failure is skipped unacked; wait for that, then start
        # again from the oldest pending entry.
        pipeline.take_error()
        pipeline.queue.join()
        ingestor.restart_backlog()
        deadline = time.monotonic() + delay
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.05)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
