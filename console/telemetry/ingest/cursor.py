"""The stream cursor: which entries of the telemetry stream this ingest consumer reads next.

Entries are read through a consumer group (workers/protocol.py: TELEMETRY_STREAM,
TELEMETRY_GROUP) and acked only once stored. The cursor first re-reads this consumer's own
pending entries (left by a crash, or by a write that failed), oldest first, then new ones.
Each ``Read`` says which kind it holds: only a replay can find its rows stored already. Now and
then it takes over entries another consumer left pending for long (that consumer died) and
trims entries every group has acked, so Redis memory stays bounded.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

log = logging.getLogger(__name__)

Entry = tuple[bytes, dict[bytes, bytes]]

# Stream entries per read. An agent batch carries up to a few hundred records, so this bounds a
# transaction at some tens of thousands of rows: large enough that the commit is a small part of
# the cost, small enough that a frame is never held back long.
READ_COUNT = 100
# How long a read waits for new entries; also the longest a shutdown request waits.
BLOCK_MS = 20
# Entries another consumer left pending this long are taken over (that consumer died).
CLAIM_IDLE_MS = 60_000
CLAIM_EVERY = 30.0
# Acked entries are trimmed from the stream this often.
TRIM_EVERY = 10.0


@dataclass(frozen=True)
class Read:
    """Entries of one read. ``replay``: they were delivered before (pending after a failure),
    so some of their rows may be stored already."""

    entries: list[Entry]
    replay: bool

    @property
    def ids(self) -> list[bytes]:
        return [entry_id for entry_id, _ in self.entries]


class StreamCursor:
    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        *,
        stream: str = TELEMETRY_STREAM,
        group: str = TELEMETRY_GROUP,
        count: int = READ_COUNT,
    ) -> None:
        # redis-py's stubs type replies as unions of every RESP shape; the stream calls below
        # return the documented list/tuple shapes.
        self.redis: Any = client
        self.consumer = consumer
        self.stream = stream
        self.group = group
        self.count = count
        # Start with our own pending entries: a crash before or after commit leaves them there.
        self.in_backlog = True
        # Where the next backlog read starts: pending entries already read (still on their way
        # through the writer) must not be read twice.
        self.backlog_from = "0"
        self.group_ready = False
        self.last_claim = 0.0
        self.last_trim = time.monotonic()

    def read(self, block_ms: int = BLOCK_MS) -> Read:
        self._ensure_group()
        if self.in_backlog:
            backlog = self._read_backlog()
            if backlog.entries:
                return backlog
            self.in_backlog = False
            self.backlog_from = "0"
        self._claim_abandoned()
        reply = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.count, block=block_ms
        )
        return Read(reply[0][1] if reply else [], replay=False)

    def _read_backlog(self) -> Read:
        reply = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: self.backlog_from}, count=self.count
        )
        entries = reply[0][1] if reply else []
        if entries:
            last = entries[-1][0]
            self.backlog_from = last.decode() if isinstance(last, bytes) else str(last)
        # Entries whose data was trimmed away come back empty: ack them so they stop coming.
        gone = [entry_id for entry_id, fields in entries if not fields]
        if gone:
            self.ack(gone)
        return Read([(entry_id, fields) for entry_id, fields in entries if fields], replay=True)

    def ack(self, ids: list[bytes]) -> None:
        if ids:
            self.redis.xack(self.stream, self.group, *ids)

    def rewind(self) -> None:
        """Read this consumer's pending entries again, from the oldest (after a failure), and
        make sure the group exists (a restarted Redis without persistence has none)."""
        self.in_backlog = True
        self.backlog_from = "0"
        self.group_ready = False

    def _ensure_group(self) -> None:
        if self.group_ready:
            return
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.group_ready = True

    def _claim_abandoned(self) -> None:
        now = time.monotonic()
        if now - self.last_claim < CLAIM_EVERY:
            return
        self.last_claim = now
        _, claimed, *_ = self.redis.xautoclaim(
            self.stream, self.group, self.consumer, CLAIM_IDLE_MS, start_id="0", count=self.count
        )
        if claimed:
            log.info("took over %d entries abandoned by another ingest consumer", len(claimed))
            self.in_backlog = True
            self.backlog_from = "0"

    def maybe_trim(self, force: bool = False) -> None:
        """Drop entries every consumer group has acked: those older than each group's oldest
        pending entry, or than its last delivered one when nothing is pending."""
        now = time.monotonic()
        if not force and now - self.last_trim < TRIM_EVERY:
            return
        self.last_trim = now
        floors = []
        for group in self.redis.xinfo_groups(self.stream):
            summary = self.redis.xpending(self.stream, group["name"])
            floor = summary["min"] if summary["pending"] else group["last-delivered-id"]
            floors.append(_entry_id(floor))
        if floors:
            ms, seq = min(floors)
            self.redis.xtrim(self.stream, minid=f"{ms}-{seq}", approximate=False)


def _entry_id(value: bytes | str) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
