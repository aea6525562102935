"""Ingest: telemetry batches from the Redis stream into PostgreSQL, then to live viewers.

One pass (``Ingestor.run_once``) reads up to READ_COUNT stream entries through the consumer
group, stores every record they carry in one transaction (idempotent: each table's identity
constraint with ON CONFLICT DO NOTHING), and acks the entries only after that commit. A crash
between commit and ack makes the entries pending again; replaying them stores nothing new, and
for such replays only the rows the database actually inserted (RETURNING) feed the anomaly
detectors and the live frames, so a replay neither duplicates points nor re-raises events.

Live viewers get one coalesced frame per job every FRAME_INTERVAL seconds: rank 0's series,
taken as soon as a first delivery is decoded (not after its commit: see feed_frames), thinned to
a budget of FRAME_BUDGET points, serialised once and PUBLISHed once to the job's
Redis pub/sub channel, where each web process's FrameHub (console.telemetry.fanout) picks it up
for all of its viewers of that job. Log tails go to the job's channel-layer group. Both are sent
from a background event loop so that Redis never stalls the database writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction

from console.jobs.models import Checkpoint, Job
from console.telemetry.anomalies import WATCHED_NAMES, AnomalyDetector
from console.telemetry.downsample import finite_or_none, thin_points
from console.telemetry.events import emit_once, job_group
from console.telemetry.fanout import busy_key, frame_channel, redis_db
from console.telemetry.models import ROLLUP_STEPS, Severity
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

log = logging.getLogger(__name__)

# Stream entries per read. An agent batch carries up to a few hundred records, so this bounds a
# transaction at some tens of thousands of rows: large enough that the commit is a small part of
# the cost, small enough that a frame is never held back long.
READ_COUNT = 100
# How long a read waits for new entries; also the longest a shutdown request waits.
BLOCK_MS = 20
FRAME_INTERVAL = 0.1
# A job with very many viewers in one web process (fanout.BUSY_VIEWERS) gets 4 frames per second
# instead of 10: each frame costs that process one send per viewer. 200 viewers at 10 frames/s
# cost Daphne about 15 % of a core here, with the frame reaching them 41 ms (p95) after it was
# published (bench/telemetry, fan-out phase), so the valve is set well above that.
BUSY_FRAME_INTERVAL = 0.25
BUSY_CHECK_EVERY = 1.0
FRAME_POINTS = 100
# Points per frame over all series. 200 viewers of 1,000-point frames fell seconds behind here
# (DESIGN.md); many series share this budget, each keeping at least FRAME_MIN_POINTS.
FRAME_BUDGET = 100
FRAME_MIN_POINTS = 10
FRAME_LOG_LINES = 200
# Entries another consumer left pending this long are taken over (that consumer died).
CLAIM_IDLE_MS = 60_000
CLAIM_EVERY = 30.0
# Acked entries are trimmed from the stream this often, so Redis memory stays bounded.
TRIM_EVERY = 10.0
STATS_KEY = "trainyard:ingest:stats"
STATS_EVERY = 1.0

# Only the rows anomaly detection or the frames use come back from the INSERT.
ANOMALY_NAMES = WATCHED_NAMES
FRAME_RANK = 0

METRIC_TEMP = """
    CREATE TEMP TABLE IF NOT EXISTS ingest_metric (
        job_id bigint, round_number integer, rank integer, seq bigint, step bigint,
        name varchar(128), value double precision, t double precision
    ) ON COMMIT DELETE ROWS
"""
# Rows per COPY write: a few MB of text at a time.
COPY_CHUNK = 20_000
# Every stored point also lands in its 100-step MetricRollup tile, in the same statement and only
# for rows this statement inserted, so tiles count each point exactly once even across replays.
# Wide-range queries read tiles instead of raw points; retention deletes raw points and keeps them.
METRIC_STORE = """
    WITH stored AS (
        INSERT INTO telemetry_metric (job_id, round_number, rank, seq, step, name, value, time)
        SELECT job_id, round_number, rank, seq, step, name, value, to_timestamp(t) FROM ingest_metric
        ON CONFLICT ON CONSTRAINT metric_identity DO NOTHING
        RETURNING job_id, round_number, rank, step, name, value, time
    ), tiles AS (
        INSERT INTO telemetry_metricrollup AS r (
            job_id, round_number, rank, name, bucket_step, last_step,
            min_value, max_value, total, count, first_time, last_time
        )
        SELECT job_id, round_number, rank, name, (step / {tile}) * {tile}, max(step),
               min(value), max(value), sum(value), count(*), min(time), max(time)
        FROM stored
        GROUP BY job_id, round_number, rank, name, (step / {tile}) * {tile}
        ON CONFLICT ON CONSTRAINT metric_rollup_identity DO UPDATE SET
            last_step = GREATEST(r.last_step, EXCLUDED.last_step),
            min_value = LEAST(r.min_value, EXCLUDED.min_value),
            max_value = GREATEST(r.max_value, EXCLUDED.max_value),
            total = r.total + EXCLUDED.total,
            count = r.count + EXCLUDED.count,
            first_time = LEAST(r.first_time, EXCLUDED.first_time),
            last_time = GREATEST(r.last_time, EXCLUDED.last_time)
    )
    {select}
""".format(tile=ROLLUP_STEPS, select="{select}")
METRIC_INSERT = METRIC_STORE.format(select="SELECT count(*) FROM stored")
METRIC_INSERT_RETURNING = METRIC_STORE.format(
    select="""SELECT job_id, round_number, rank, step, name, value, extract(epoch FROM time)::float8
    FROM stored WHERE rank = %s OR name = ANY(%s)"""
)
LOG_TEMP = """
    CREATE TEMP TABLE IF NOT EXISTS ingest_log (
        job_id bigint, round_number integer, rank integer, stream varchar(6), seq bigint,
        text text, t double precision
    ) ON COMMIT DELETE ROWS
"""
LOG_INSERT = """
    INSERT INTO telemetry_logline (job_id, round_number, rank, stream, seq, text, time)
    SELECT job_id, round_number, rank, stream, seq, text, to_timestamp(t) FROM ingest_log
    ON CONFLICT ON CONSTRAINT logline_identity DO NOTHING
    RETURNING id, job_id, round_number, rank, stream, seq, text
"""


def store_metrics(
    rows: list[tuple[int, int, int, int, int, str, float, float]], replay: bool = True, text: str = ""
) -> list[tuple[int, int, int, int, str, float, float]]:
    """Store points (job, round, rank, seq, step, name, value, t) with their tiles, inside the
    caller's transaction. Returns the (job, round, rank, step, name, value, t) of stored points
    that anomaly detection and live frames need: exactly the newly inserted ones with ``replay``,
    else all of them (first deliveries: a row can only pre-exist if an agent re-sent a batch; the
    database keeps one copy, and detectors and frames tolerate seeing such a point twice)."""
    if connection.vendor != "postgresql":
        return _store_metrics_portable(rows)
    with connection.cursor() as cur:
        raw = cur.cursor  # psycopg cursor: COPY is not part of the DB-API
        raw.execute(METRIC_TEMP)
        with raw.copy(
            "COPY ingest_metric (job_id, round_number, rank, seq, step, name, value, t) FROM STDIN"
        ) as copy:
            if text:
                copy.write(text)
            else:
                for start in range(0, len(rows), COPY_CHUNK):
                    copy.write(copy_text(rows[start : start + COPY_CHUNK]))
        if replay:
            raw.execute(METRIC_INSERT_RETURNING, (FRAME_RANK, list(ANOMALY_NAMES)))
            result: list[tuple[int, int, int, int, str, float, float]] = raw.fetchall()
            raw.execute("TRUNCATE ingest_metric")
            return result
        raw.execute(METRIC_INSERT)
        raw.execute("TRUNCATE ingest_metric")
    wanted = set(ANOMALY_NAMES)
    return [
        (job, rnd, rank, step, name, value, t)
        for job, rnd, rank, _seq, step, name, value, t in rows
        if rank == FRAME_RANK or name in wanted
    ]


# The one-machine console (``manage.py up`` without DATABASE_URL) runs on SQLite: row by row,
# slower, but with the same identity, tiles and "only newly stored rows" semantics.
TILE_UPSERT_PORTABLE = """
    INSERT INTO telemetry_metricrollup (
        job_id, round_number, rank, name, bucket_step, last_step,
        min_value, max_value, total, count, first_time, last_time
    ) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (job_id, round_number, rank, name, bucket_step) DO UPDATE SET
        last_step = max(last_step, excluded.last_step),
        min_value = min(min_value, excluded.min_value),
        max_value = max(max_value, excluded.max_value),
        total = total + excluded.total,
        count = count + excluded.count,
        first_time = min(first_time, excluded.first_time),
        last_time = max(last_time, excluded.last_time)
"""


def _store_metrics_portable(
    rows: list[tuple[int, int, int, int, int, str, float, float]],
) -> list[tuple[int, int, int, int, str, float, float]]:
    stored = []
    tiles: dict[tuple[int, int, int, str, int], list[Any]] = {}
    with connection.cursor() as cur:
        for job, rnd, rank, seq, step, name, value, t in rows:
            when = datetime.fromtimestamp(t, UTC)
            cur.execute(
                "INSERT INTO telemetry_metric (job_id, round_number, rank, seq, step, name, value, time) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [job, rnd, rank, seq, step, name, value, when],
            )
            if cur.rowcount != 1:
                continue
            stored.append((job, rnd, rank, step, name, value, t))
            key = (job, rnd, rank, name, (step // ROLLUP_STEPS) * ROLLUP_STEPS)
            tile = tiles.get(key)
            if tile is None:
                tiles[key] = [step, value, value, value, 1, when, when]
            else:
                tile[0] = max(tile[0], step)
                tile[1] = min(tile[1], value)
                tile[2] = max(tile[2], value)
                tile[3] += value
                tile[4] += 1
                tile[5] = min(tile[5], when)
                tile[6] = max(tile[6], when)
        for key, tile in tiles.items():
            cur.execute(TILE_UPSERT_PORTABLE, [*key, *tile])
    wanted = set(ANOMALY_NAMES)
    return [p for p in stored if p[2] == FRAME_RANK or p[4] in wanted]


def _store_logs_portable(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    stored = []
    with connection.cursor() as cur:
        for job, rnd, rank, stream, seq, text, t in rows:
            cur.execute(
                "INSERT INTO telemetry_logline (job_id, round_number, rank, stream, seq, text, time) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [job, rnd, rank, stream, seq, text, datetime.fromtimestamp(t, UTC)],
            )
            if cur.rowcount == 1:
                stored.append((cur.lastrowid, job, rnd, rank, stream, seq, text))
    return stored


def _entry_id(value: bytes | str) -> tuple[int, int]:
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class BadBatch(ValueError):
    pass


@dataclass
class Decoded:
    """Rows of one read, grouped by table."""

    metrics: list[tuple[int, int, int, int, int, str, float, float]] = field(default_factory=list)
    logs: list[tuple[int, int, int, str, int, str, float]] = field(default_factory=list)
    checkpoints: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[int, int, int, dict[str, Any]]] = field(default_factory=list)
    dropped: list[tuple[int, int, int, dict[str, Any]]] = field(default_factory=list)
    job_ids: set[int] = field(default_factory=set)
    records: int = 0
    bad_records: int = 0


def _num(record: dict[str, Any], key: str) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadBatch(f"{key} must be a non-negative integer")
    return value


def _time(record: dict[str, Any]) -> float:
    value = record.get("t")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return time.time()
    return float(value)


def json_safe(value: Any) -> Any:
    """Agent-supplied data with NaN/Infinity replaced by None: jsonb and browsers reject them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(rows: list[tuple[int, int, int, int, int, str, float, float]]) -> str:
    """Rows in COPY text format. Formatting by hand is about three times faster than
    ``write_row`` here; float repr ("nan", "inf") is what PostgreSQL's float parser accepts."""
    names: dict[str, str] = {}
    out = []
    for job, rnd, rank, seq, step, name, value, t in rows:
        escaped = names.get(name)
        if escaped is None:
            escaped = names[name] = name.translate(_COPY_ESCAPES)
        out.append(f"{job}\t{rnd}\t{rank}\t{seq}\t{step}\t{escaped}\t{value!r}\t{t!r}\n")
    return "".join(out)


def decode_batch(raw: bytes | str, into: Decoded) -> None:
    """Add one stream entry's records to ``into``; raises BadBatch when the envelope is unusable.
    A bad record inside a good batch is skipped and counted, never fatal."""
    try:
        batch = json.loads(raw)
        job_id = _num(batch, "job_id")
        round_number = _num(batch, "round")
        rank = _num(batch, "rank")
        records = batch["records"]
        if not isinstance(records, list):
            raise BadBatch("records must be a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise BadBatch(str(exc)) from exc
    into.job_ids.add(job_id)
    for record in records:
        into.records += 1
        try:
            kind = record["kind"]
            seq = _num(record, "seq")
            t = _time(record)
            if kind == "metric":
                step = _num(record, "step")
                values = record["values"]
                for name, value in values.items():
                    if value is None:
                        # The SDK sends a NaN/Inf as null (JSON has neither): keep it, as NaN, so
                        # the chart shows the gap and the loss detector sees the divergence.
                        value = math.nan
                    if isinstance(value, bool) or not isinstance(value, int | float) or len(name) > 128:
                        into.bad_records += 1
                        continue
                    into.metrics.append((job_id, round_number, rank, seq, step, name, float(value), t))
            elif kind == "log":
                stream = record.get("stream", "stdout")
                if stream not in ("stdout", "stderr"):
                    raise BadBatch("stream must be stdout or stderr")
                into.logs.append((job_id, round_number, rank, stream, seq, str(record["text"]), t))
            elif kind == "checkpoint":
                into.checkpoints.append((job_id, round_number, record))
            elif kind == "event":
                into.events.append((job_id, round_number, rank, record))
            elif kind == "dropped":
                into.dropped.append((job_id, round_number, rank, record))
            else:
                into.bad_records += 1
        except (BadBatch, KeyError, TypeError, AttributeError, ValueError):
            into.bad_records += 1


@dataclass
class Prepared:
    """One read, decoded and ready to store."""

    entry_ids: list[bytes]
    decoded: Decoded
    known: set[int]
    metrics: list[tuple[int, int, int, int, int, str, float, float]]
    metric_text: str
    replay: bool


@dataclass
class JobFrame:
    round_number: int = 0
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    logs_skipped: int = 0


class Broadcaster:
    """Publishes frames and sends channel-layer messages from a private event loop thread.

    ``async_to_sync`` would start a loop per call and channels-redis keeps a connection pool per
    loop; one long-lived loop keeps one pool and never blocks the caller."""

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

    def send(self, group: str, message: dict[str, Any]) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        self._track(asyncio.run_coroutine_threadsafe(self._send(layer, group, message), self.loop))

    def publish_frame(self, job_id: int, text: str) -> None:
        """One PUBLISH per frame, whatever the number of viewers (see console.telemetry.fanout)."""
        channel = frame_channel(job_id, redis_db(self.redis))
        self._track(asyncio.run_coroutine_threadsafe(self._publish(channel, text), self.loop))

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


class Ingestor:
    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        *,
        broadcaster: Broadcaster | None = None,
        stream: str = TELEMETRY_STREAM,
        group: str = TELEMETRY_GROUP,
        frame_interval: float = FRAME_INTERVAL,
    ) -> None:
        # redis-py's stubs type replies as unions of every RESP shape; the stream calls below
        # return the documented list/tuple shapes.
        self.redis: Any = client
        self.consumer = consumer
        self.stream = stream
        self.group = group
        self.broadcaster = broadcaster
        self.frame_interval = frame_interval
        self.detector = AnomalyDetector()
        # Guards frames and the stats counters, which the writer thread of a Pipeline updates.
        self.lock = threading.Lock()
        self.frames: dict[int, JobFrame] = {}
        self.frame_numbers: dict[int, int] = {}
        self.last_flush = time.monotonic()
        # Per job: when its last frame went out, and whether (as of when) a web process reported
        # many viewers of it.
        self.job_flushed: dict[int, float] = {}
        self.job_busy: dict[int, tuple[float, bool]] = {}
        self.last_claim = 0.0
        self.last_stats = time.monotonic()
        self.last_trim = time.monotonic()
        # Start by re-reading our own pending entries: a crash after commit and before ack, or
        # before commit, leaves them there.
        self.backlog = True
        # Where the next backlog read starts: entries read but not yet acked (still on their way
        # through the writer) stay pending, and must not be read again.
        self.backlog_cursor = "0"
        # True while the entries being handled were delivered before (pending after a crash):
        # only then can rows already exist, and only then is RETURNING needed to tell new from old.
        self.replaying = False
        self.points_since_stats = 0
        self.records_since_stats = 0
        self.entries_since_stats = 0

    # --- stream ----------------------------------------------------------------------------
    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, block_ms: int = BLOCK_MS) -> list[tuple[bytes, dict[bytes, bytes]]]:
        if self.backlog:
            reply = self.redis.xreadgroup(
                self.group, self.consumer, {self.stream: self.backlog_cursor}, count=READ_COUNT
            )
            entries = reply[0][1] if reply else []
            if entries:
                last = entries[-1][0]
                self.backlog_cursor = last.decode() if isinstance(last, bytes) else str(last)
            # Entries whose data was trimmed away come back empty: ack them so they stop coming.
            gone = [eid for eid, fields in entries if not fields]
            if gone:
                self.redis.xack(self.stream, self.group, *gone)
            entries = [(eid, fields) for eid, fields in entries if fields]
            if entries:
                self.replaying = True
                return entries
            self.backlog = False
            self.backlog_cursor = "0"
        self.replaying = False
        self._claim_abandoned()
        reply = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=READ_COUNT, block=block_ms
        )
        return reply[0][1] if reply else []

    def _claim_abandoned(self) -> None:
        now = time.monotonic()
        if now - self.last_claim < CLAIM_EVERY:
            return
        self.last_claim = now
        _, claimed, *_ = self.redis.xautoclaim(
            self.stream, self.group, self.consumer, CLAIM_IDLE_MS, start_id="0", count=READ_COUNT
        )
        if claimed:
            log.info("took over %d entries abandoned by another ingest consumer", len(claimed))
            self.restart_backlog()

    def restart_backlog(self) -> None:
        """Read this consumer's pending entries again, from the oldest (after a failure)."""
        self.backlog = True
        self.backlog_cursor = "0"

    # --- one pass --------------------------------------------------------------------------
    def run_once(self, block_ms: int = BLOCK_MS) -> int:
        """Read, store, ack, maybe flush frames. Returns the number of entries handled."""
        entries = self.read(block_ms)
        if entries:
            self.handle(entries)
        self.maybe_flush()
        self.maybe_report_stats()
        self.maybe_trim()
        return len(entries)

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

    def handle(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> int:
        return self.commit(self.take(entries))

    def take(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> Prepared:
        """Decodes entries just read (prepare) and hands their live points to the frames."""
        prepared = self.prepare(entries, self.replaying)
        self.feed_frames(prepared)
        return prepared

    def feed_frames(self, prepared: Prepared) -> None:
        """Live points go to the frames as soon as they are decoded, before the database write:
        viewers should not wait for PostgreSQL (a commit under load took hundreds of ms here).
        First deliveries only: a replay's points reach the frames after its commit, and only
        those the database did not have yet. If the write then fails, the entries are replayed
        and their points sent again; a chart draws a step it already has at the same place."""
        if prepared.replay or not prepared.metrics:
            return
        points = [
            (job, rnd, rank, step, name, value, t)
            for job, rnd, rank, _seq, step, name, value, t in prepared.metrics
            if rank == FRAME_RANK
        ]
        with self.lock:
            self._add_to_frames(points, [])
        self.maybe_flush()

    def prepare(self, entries: list[tuple[bytes, dict[bytes, bytes]]], replay: bool) -> Prepared:
        """Decode entries into rows ready to store: the CPU half of a pass, no writes."""
        decoded = Decoded()
        for entry_id, fields in entries:
            raw = fields.get(b"batch")
            try:
                if raw is None:
                    raise BadBatch("no batch field")
                decode_batch(raw, decoded)
            except BadBatch as exc:
                log.warning("dropping malformed telemetry entry %s: %s", entry_id.decode(), exc)
        if decoded.bad_records:
            log.warning("skipped %d malformed telemetry records", decoded.bad_records)
        return self._prepare_decoded(decoded, replay, [eid for eid, _ in entries])

    def _prepare_decoded(self, decoded: Decoded, replay: bool, entry_ids: list[bytes]) -> Prepared:
        known = set(Job.objects.filter(pk__in=decoded.job_ids).values_list("pk", flat=True))
        unknown = decoded.job_ids - known
        if unknown:
            log.warning("dropping telemetry for unknown jobs %s", sorted(unknown))
        metrics = [m for m in decoded.metrics if m[0] in known]
        return Prepared(
            entry_ids=entry_ids,
            decoded=decoded,
            known=known,
            metrics=metrics,
            metric_text=copy_text(metrics) if metrics and connection.vendor == "postgresql" else "",
            replay=replay,
        )

    def commit(self, prepared: Prepared) -> int:
        """Store, commit, then ack: the database half of a pass."""
        stored = self._write(prepared)
        # Ack strictly after the commit inside _write(): a crash before this line replays them.
        if prepared.entry_ids:
            self.redis.xack(self.stream, self.group, *prepared.entry_ids)
        with self.lock:
            self.entries_since_stats += len(prepared.entry_ids)
            self.records_since_stats += prepared.decoded.records
        return stored

    def store(self, decoded: Decoded, replay: bool = True) -> int:
        """Store decoded records (no stream involved); returns the number of metric points."""
        return self._write(self._prepare_decoded(decoded, replay, []))

    def _write(self, prepared: Prepared) -> int:
        decoded, known = prepared.decoded, prepared.known
        logs = [entry for entry in decoded.logs if entry[0] in known]
        with transaction.atomic():
            stored_points = (
                store_metrics(prepared.metrics, prepared.replay, prepared.metric_text)
                if prepared.metrics
                else []
            )
            stored_logs = self._store_logs(logs) if logs else []
            self._store_checkpoints([c for c in decoded.checkpoints if c[0] in known])
            self._store_events([e for e in decoded.events if e[0] in known])
            self._store_dropped([d for d in decoded.dropped if d[0] in known])
            for job_id, round_number, rank, step, name, value, t in stored_points:
                anomaly = self.detector.observe(job_id, round_number, rank, step, name, value, t)
                if anomaly is not None:
                    emit_once(
                        anomaly.key,
                        anomaly.kind,
                        anomaly.message,
                        job=Job(pk=anomaly.job_id, round_number=anomaly.round_number),
                        round_number=anomaly.round_number,
                        severity=anomaly.severity,
                        **anomaly.data,
                    )
        with self.lock:
            self.points_since_stats += len(prepared.metrics)
            # First deliveries' points went to the frames before the write (feed_frames).
            self._add_to_frames(stored_points if prepared.replay else [], stored_logs)
        self.maybe_flush()
        return len(prepared.metrics)

    def _store_logs(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if connection.vendor != "postgresql":
            return _store_logs_portable(rows)
        with connection.cursor() as cur:
            raw = cur.cursor
            raw.execute(LOG_TEMP)
            with raw.copy(
                "COPY ingest_log (job_id, round_number, rank, stream, seq, text, t) FROM STDIN"
            ) as copy:
                for row in rows:
                    # PostgreSQL text cannot hold NUL; a binary blob on stdout must not stall ingest.
                    copy.write_row((*row[:5], row[5].replace("\x00", "\ufffd"), row[6]))
            raw.execute(LOG_INSERT)
            return raw.fetchall()

    def _store_checkpoints(self, rows: Iterable[tuple[int, int, dict[str, Any]]]) -> None:
        objs = []
        for job_id, round_number, record in rows:
            try:
                objs.append(
                    Checkpoint(
                        job_id=job_id,
                        round_number=round_number,
                        step=_num(record, "step"),
                        path=str(record["path"])[:1024],
                        size_bytes=int(record.get("size_bytes") or 0),
                        blocking_ms=float(record.get("blocking_ms") or 0.0),
                    )
                )
            except (BadBatch, KeyError, TypeError, ValueError):
                log.warning("skipped malformed checkpoint record for job %s", job_id)
        if objs:
            Checkpoint.objects.bulk_create(objs, ignore_conflicts=True)

    def _store_events(self, rows: Iterable[tuple[int, int, int, dict[str, Any]]]) -> None:
        for job_id, round_number, rank, record in rows:
            name = str(record.get("event") or "event")[:64]
            severity = record.get("severity") or Severity.INFO
            if severity not in Severity.values:
                severity = Severity.WARNING
            raw_data = record.get("data")
            data: dict[str, Any] = json_safe(raw_data) if isinstance(raw_data, dict) else {}
            emit_once(
                f"record:{job_id}:{round_number}:{rank}:event:{record['seq']}",
                name,
                str(record.get("message") or name),
                job=Job(pk=job_id, round_number=round_number),
                round_number=round_number,
                severity=severity,
                rank=rank,
                **{k: v for k, v in data.items() if k != "rank"},
            )

    def _store_dropped(self, rows: Iterable[tuple[int, int, int, dict[str, Any]]]) -> None:
        for job_id, round_number, rank, record in rows:
            count = record.get("count")
            emit_once(
                f"record:{job_id}:{round_number}:{rank}:dropped:{record['seq']}",
                "telemetry_dropped",
                f"The agent dropped {count} metric points of rank {rank} (its buffer was full).",
                job=Job(pk=job_id, round_number=round_number),
                round_number=round_number,
                severity=Severity.WARNING,
                rank=rank,
                count=json_safe(count),
            )

    # --- frames ----------------------------------------------------------------------------
    def _add_to_frames(
        self, points: list[tuple[int, int, int, int, str, float, float]], logs: list[tuple[Any, ...]]
    ) -> None:
        for job_id, round_number, rank, step, name, value, _t in points:
            if rank != FRAME_RANK:
                continue
            frame = self.frames.setdefault(job_id, JobFrame())
            frame.round_number = max(frame.round_number, round_number)
            frame.series.setdefault(name, []).append((step, value))
        for row_id, job_id, round_number, rank, stream, seq, text in logs:
            frame = self.frames.setdefault(job_id, JobFrame())
            frame.round_number = max(frame.round_number, round_number)
            if len(frame.logs) >= FRAME_LOG_LINES:
                # Viewers that want every line page through the logs API; the live tail keeps
                # the newest ones.
                frame.logs.pop(0)
                frame.logs_skipped += 1
            frame.logs.append({"id": row_id, "rank": rank, "stream": stream, "text": text, "seq": seq})

    def maybe_flush(self, force: bool = False) -> None:
        # Called by the reading thread between reads and by a Pipeline's writer right after each
        # commit (so fresh points do not wait for the next read); the lock keeps frame numbers in
        # order and each frame sent once.
        with self.lock:
            self._flush(force)

    def _flush(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self.last_flush < self.frame_interval:
            return
        self.last_flush = now
        frames, self.frames = self.frames, {}
        for job_id, frame in frames.items():
            if (
                not force
                and now - self.job_flushed.get(job_id, 0.0) < BUSY_FRAME_INTERVAL
                and self._busy(job_id, now)
            ):
                # Still accumulating: the next frame carries these points too, thinned as usual.
                self.frames[job_id] = frame
                continue
            self.job_flushed[job_id] = now
            number = self.frame_numbers.get(job_id, 0) + 1
            self.frame_numbers[job_id] = number
            # The client JSON is built here once, not by each of a job's viewers' consumers.
            if frame.series and self.broadcaster is not None:
                limit = max(FRAME_MIN_POINTS, min(FRAME_POINTS, FRAME_BUDGET // len(frame.series)))
                series = {
                    name: [[s, finite_or_none(v)] for s, v in thin_points(pts, limit)]
                    for name, pts in frame.series.items()
                }
                self.broadcaster.publish_frame(
                    job_id,
                    json.dumps(
                        {"type": "metrics", "series": series, "round": frame.round_number, "frame": number},
                        separators=(",", ":"),
                        allow_nan=False,
                    ),
                )
            if frame.logs and self.broadcaster is not None:
                log_text = json.dumps(
                    {"type": "log", "lines": frame.logs, "skipped": frame.logs_skipped, "frame": number},
                    separators=(",", ":"),
                )
                self.broadcaster.send(
                    job_group(job_id), {"type": "job.frame", "frame": number, "log": log_text}
                )

    def _busy(self, job_id: int, now: float) -> bool:
        """Whether some web process has many viewers of this job (fanout.BUSY_VIEWERS): their
        frames then go out every BUSY_FRAME_INTERVAL instead of every frame_interval. Asked of
        Redis at most once a second per job; a failed check counts as not busy."""
        checked = self.job_busy.get(job_id)
        if checked is not None and now - checked[0] < BUSY_CHECK_EVERY:
            return checked[1]
        try:
            busy = bool(self.redis.exists(busy_key(job_id)))
        except redis.RedisError:
            busy = False
        self.job_busy[job_id] = (now, busy)
        return busy

    def maybe_report_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.last_stats
        if not force and elapsed < STATS_EVERY:
            return
        self.last_stats = now
        with self.lock:
            points, records, entries = (
                self.points_since_stats,
                self.records_since_stats,
                self.entries_since_stats,
            )
            self.points_since_stats = self.records_since_stats = self.entries_since_stats = 0
        rate = points / elapsed if elapsed > 0 else 0.0
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(STATS_KEY, "points_total", points)
        pipe.hincrby(STATS_KEY, "records_total", records)
        pipe.hincrby(STATS_KEY, "entries_total", entries)
        pipe.hset(
            STATS_KEY, mapping={f"rate:{self.consumer}": f"{rate:.1f}", f"seen:{self.consumer}": time.time()}
        )
        pipe.execute()


# Reads decoded ahead of the writer. Two keep PostgreSQL busy while the next read is decoded;
# more would only hold more unacked entries in memory.
PIPELINE_DEPTH = 2


class Pipeline:
    """Overlaps the two halves of a pass: the calling thread reads and decodes the next entries
    while a writer thread stores, commits and acks the previous ones (psycopg releases the GIL
    while PostgreSQL works). Order is kept: one writer, a FIFO queue.

    After a failed write the writer skips everything queued behind it (none of it is acked) and
    reports the error through ``take_error``; the caller then re-reads its pending entries."""

    def __init__(self, ingestor: Ingestor, depth: int = PIPELINE_DEPTH) -> None:
        self.ingestor = ingestor
        self.queue: queue.Queue[Prepared | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self.thread.start()

    def submit(self, prepared: Prepared) -> None:
        self.queue.put(prepared)

    def take_error(self) -> BaseException | None:
        """The writer's failure, once everything queued behind it has been skipped."""
        if self.error is None:
            return None
        self.queue.join()
        error, self.error = self.error, None
        return error

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                try:
                    if item is None:
                        return
                    if self.error is None:
                        try:
                            self.ingestor.commit(item)
                        except Exception as exc:
                            self.error = exc
                            connection.close()  # a broken connection must not be reused
                finally:
                    self.queue.task_done()
        finally:
            connection.close()
