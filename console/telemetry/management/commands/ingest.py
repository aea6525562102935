"""``manage.py ingest``: the telemetry ingest daemon (see console.telemetry.ingest.loop)."""

from __future__ import annotations

import logging
import signal
import socket
from types import FrameType
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from console.telemetry.ingest.broadcast import Broadcaster
from console.telemetry.ingest.frames import FRAME_INTERVAL
from console.telemetry.ingest.loop import IngestLoop

log = logging.getLogger("console.telemetry.ingest")


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
        loop = IngestLoop(
            client, options["consumer"], sink=broadcaster, frame_interval=options["frame_interval"]
        )
        log.info("ingest %s consuming %s", options["consumer"], loop.cursor.stream)
        try:
            loop.run(lambda: self.stopping)
        finally:
            loop.close()
            broadcaster.close()
            log.info("ingest %s stopped", options["consumer"])

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
