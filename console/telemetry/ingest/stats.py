"""Ingest's own figures for /metrics (console.telemetry.prometheus): totals and each consumer's
rate, kept in one Redis hash so that every ingest process adds to the same counters."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

STATS_KEY = "trainyard:ingest:stats"
STATS_EVERY = 1.0


class IngestStats:
    """Counts what the writer committed; the loop reports it to Redis about once a second."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        self.redis: Any = client
        self.consumer = consumer
        self.lock = threading.Lock()
        self.points = self.records = self.entries = 0
        self.last_report = time.monotonic()

    def count(self, *, entries: int, records: int, points: int) -> None:
        with self.lock:
            self.entries += entries
            self.records += records
            self.points += points

    def maybe_report(self, force: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.last_report
        if not force and elapsed < STATS_EVERY:
            return
        self.last_report = now
        with self.lock:
            points, records, entries = self.points, self.records, self.entries
            self.points = self.records = self.entries = 0
        rate = points / elapsed if elapsed > 0 else 0.0
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(STATS_KEY, "points_total", points)
        pipe.hincrby(STATS_KEY, "records_total", records)
        pipe.hincrby(STATS_KEY, "entries_total", entries)
        pipe.hset(
            STATS_KEY, mapping={f"rate:{self.consumer}": f"{rate:.1f}", f"seen:{self.consumer}": time.time()}
        )
        try:
            pipe.execute()
        except redis.RedisError:
            # Not lost: counted again at the next report.
            self.count(entries=entries, records=records, points=points)
            raise
