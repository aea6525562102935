"""Ingest's own figures for /metrics (console.telemetry.prometheus): totals and each consumer's
rate, kept in one Redis hash so that every ingest process adds to the same counters."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis

STATS_KEY = "trainyard:ingest:stats"
STATS_EVERY = 1.0
REFUSED_PREFIX = "refused:"  # + the reason (trust.Refusal): entries refused for it


class IngestStats:
    """Counts what the writer committed (and the entries it acked refused, by reason); the loop
    reports it to Redis about once a second."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        self.redis: Any = client
        self.consumer = consumer
        self.lock = threading.Lock()
        self.points = self.records = self.entries = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self.last_report = time.monotonic()

    def count(
        self, *, entries: int, records: int, points: int, refused: Mapping[str, int] | None = None
    ) -> None:
        with self.lock:
            self.entries += entries
            self.records += records
            self.points += points
            self.refused.update(refused or {})

    def maybe_report(self, force: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.last_report
        if not force and elapsed < STATS_EVERY:
            return
        self.last_report = now
        with self.lock:
            points, records, entries, refused = self.points, self.records, self.entries, self.refused
            self.points = self.records = self.entries = 0
            self.refused = collections.Counter()
        rate = points / elapsed if elapsed > 0 else 0.0
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(STATS_KEY, "points_total", points)
        pipe.hincrby(STATS_KEY, "records_total", records)
        pipe.hincrby(STATS_KEY, "entries_total", entries)
        for reason, count in refused.items():
            pipe.hincrby(STATS_KEY, REFUSED_PREFIX + reason, count)
        pipe.hset(
            STATS_KEY, mapping={f"rate:{self.consumer}": f"{rate:.1f}", f"seen:{self.consumer}": time.time()}
        )
        try:
            pipe.execute()
        except redis.RedisError:
            # Not lost: counted again at the next report.
            self.count(entries=entries, records=records, points=points, refused=refused)
            raise
