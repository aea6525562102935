"""Storage: one read's decoded rows into PostgreSQL in one transaction, idempotently.

Every table has an identity constraint (metric_identity, logline_identity, checkpoint's, the
Event dedupe_key), so a read applied twice (ingest died between commit and ack, or the commit's
reply was lost with the connection) stores nothing the second time, and only rows the database
did not have yet count: in the 100-step MetricRollup tiles, in the anomaly detectors and in
the live frames.

Metric points take one of two paths. A first delivery is COPYed straight into telemetry_metric
inside a savepoint, its tiles computed here: nothing of it can exist yet unless an agent sent a
batch again, and then the unique index fails the COPY, the savepoint is rolled back and the read
takes the second path. A redelivered read (pending after a failure) goes through a temporary
table with ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, whose tiles and returned rows are
exactly the points inserted. The first path is close to a bare COPY; the second costs about
twice as much, which only replays pay.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import IntegrityError, connection, transaction

from console.core.states import JobState
from console.jobs.models import Checkpoint, Job
from console.telemetry.anomalies import AnomalyDetector
from console.telemetry.events import emit_once
from console.telemetry.ingest.decoding import CheckpointRow, Decoded, EventRow, LogRow, MetricRow
from console.telemetry.models import ROLLUP_STEPS

log = logging.getLogger(__name__)

TERMINAL_STATES = [state.value for state in JobState if state.is_terminal]

METRIC_COLUMNS = "job_id, round_number, rank, seq, step, name, value, time"
METRIC_COPY = f"COPY telemetry_metric ({METRIC_COLUMNS}) FROM STDIN (FORMAT BINARY)"
# A tile: (job, round, rank, name, bucket_step, last_step, min, max, total, count, first t, last t).
TileRow = tuple[int, int, int, str, int, int, float, float, float, int, float, float]
# A stored log line as the live tail needs it: (id, job, round, rank, stream, seq, text).
StoredLog = tuple[int, int, int, int, str, int, str]

METRIC_TEMP = """
    CREATE TEMP TABLE IF NOT EXISTS ingest_metric (
        job_id bigint, round_number integer, rank integer, seq bigint, step bigint,
        name varchar(128), value double precision, time timestamptz
    ) ON COMMIT DELETE ROWS
"""
# Replays: only rows this statement inserted reach the tiles and come back, so tiles count each
# point exactly once however often its read is applied.
METRIC_DEDUPLICATED = f"""
    WITH stored AS (
        INSERT INTO telemetry_metric ({METRIC_COLUMNS})
        SELECT {METRIC_COLUMNS} FROM ingest_metric
        ON CONFLICT ON CONSTRAINT metric_identity DO NOTHING
        RETURNING {METRIC_COLUMNS}
    ), tiles AS (
        INSERT INTO telemetry_metricrollup AS r (
            job_id, round_number, rank, name, bucket_step, last_step,
            min_value, max_value, total, count, first_time, last_time
        )
        SELECT job_id, round_number, rank, name, (step / {ROLLUP_STEPS}) * {ROLLUP_STEPS}, max(step),
               min(value), max(value), sum(value), count(*), min(time), max(time)
        FROM stored
        GROUP BY job_id, round_number, rank, name, (step / {ROLLUP_STEPS}) * {ROLLUP_STEPS}
        ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT ON CONSTRAINT metric_rollup_identity DO UPDATE SET
            last_step = GREATEST(r.last_step, EXCLUDED.last_step),
            min_value = LEAST(r.min_value, EXCLUDED.min_value),
            max_value = GREATEST(r.max_value, EXCLUDED.max_value),
            total = r.total + EXCLUDED.total,
            count = r.count + EXCLUDED.count,
            first_time = LEAST(r.first_time, EXCLUDED.first_time),
            last_time = GREATEST(r.last_time, EXCLUDED.last_time)
    )
    SELECT job_id, round_number, rank, seq, step, name, value, extract(epoch FROM time)::float8
    FROM stored
"""
TILE_UPSERT = """
    INSERT INTO telemetry_metricrollup AS r (
        job_id, round_number, rank, name, bucket_step, last_step,
        min_value, max_value, total, count, first_time, last_time
    )
    SELECT job, rnd, rank, name, bucket, last_step, lo, hi, total, n, to_timestamp(t0), to_timestamp(t1)
    FROM unnest(
        %s::bigint[], %s::integer[], %s::integer[], %s::varchar[], %s::bigint[], %s::bigint[],
        %s::float8[], %s::float8[], %s::float8[], %s::bigint[], %s::float8[], %s::float8[]
    ) AS t(job, rnd, rank, name, bucket, last_step, lo, hi, total, n, t0, t1)
    ON CONFLICT ON CONSTRAINT metric_rollup_identity DO UPDATE SET
        last_step = GREATEST(r.last_step, EXCLUDED.last_step),
        min_value = LEAST(r.min_value, EXCLUDED.min_value),
        max_value = GREATEST(r.max_value, EXCLUDED.max_value),
        total = r.total + EXCLUDED.total,
        count = r.count + EXCLUDED.count,
        first_time = LEAST(r.first_time, EXCLUDED.first_time),
        last_time = GREATEST(r.last_time, EXCLUDED.last_time)
"""
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


@dataclass
class MetricBatch:
    """Metric rows ready to write: their COPY data and their tiles (computed off the writer)."""

    rows: list[MetricRow] = field(default_factory=list)
    data: bytes = b""
    tiles: list[TileRow] = field(default_factory=list)

    @classmethod
    def of(cls, rows: list[MetricRow]) -> MetricBatch:
        return cls(rows, copy_data(rows), tile_rows(rows)) if rows else cls()


@dataclass
class Stored:
    """What one write added: metric rows and log lines the database did not have before."""

    points: list[MetricRow]
    logs: list[StoredLog]


def known_jobs(job_ids: Iterable[int]) -> set[int]:
    """The ids among ``job_ids`` that exist: telemetry for any other job is dropped."""
    return set(Job.objects.filter(pk__in=list(job_ids)).values_list("pk", flat=True))


def ended_jobs(job_ids: set[int]) -> set[int]:
    """The ids among ``job_ids`` whose job has ended or is gone."""
    running = Job.objects.filter(pk__in=list(job_ids)).exclude(state__in=TERMINAL_STATES)
    return job_ids - set(running.values_list("pk", flat=True))


def only_jobs(decoded: Decoded, known: set[int]) -> Decoded:
    """``decoded`` without the rows of jobs not in ``known``."""
    return Decoded(
        metrics=[m for m in decoded.metrics if m[0] in known],
        logs=[row for row in decoded.logs if row[0] in known],
        checkpoints=[c for c in decoded.checkpoints if c[0] in known],
        events=[e for e in decoded.events if e.job_id in known],
        job_ids=decoded.job_ids & known,
        records=decoded.records,
        bad_records=decoded.bad_records,
    )


def store_read(decoded: Decoded, metrics: MetricBatch, *, replay: bool, detector: AnomalyDetector) -> Stored:
    """Store one read in one transaction, with the anomaly events its new points raise.
    ``replay``: the read was delivered before (its rows may exist already)."""
    with transaction.atomic():
        points = store_metrics(metrics, replay=replay) if metrics.rows else []
        logs = store_logs(decoded.logs) if decoded.logs else []
        store_checkpoints(decoded.checkpoints)
        store_events(decoded.events)
        for anomaly in detector.observe_rows(points):
            emit_once(
                anomaly.key,
                anomaly.kind,
                anomaly.message,
                job=Job(pk=anomaly.job_id, round_number=anomaly.round_number),
                round_number=anomaly.round_number,
                severity=anomaly.severity,
                **anomaly.data,
            )
    return Stored(points, logs)


def store_metrics(batch: MetricBatch, *, replay: bool) -> list[MetricRow]:
    """Store points with their tiles, inside the caller's transaction; returns the points that
    were not stored before."""
    if not replay:
        try:
            with transaction.atomic():  # a savepoint: a failed COPY leaves the transaction usable
                _copy(METRIC_COPY, batch.data)
        except (IntegrityError, psycopg.errors.UniqueViolation):
            # (COPY runs on psycopg's own cursor: its errors come unwrapped by Django.)
            log.info("a first delivery repeats stored points (an agent re-sent a batch); deduplicating")
        else:
            upsert_tiles(batch.tiles)
            return batch.rows
    with connection.cursor() as cur:
        cur.execute(METRIC_TEMP)
    _copy(f"COPY ingest_metric ({METRIC_COLUMNS}) FROM STDIN (FORMAT BINARY)", batch.data)
    with connection.cursor() as cur:
        cur.execute(METRIC_DEDUPLICATED)
        stored: list[MetricRow] = cur.fetchall()
        # ON COMMIT DELETE ROWS only empties it at commit; the fast path may follow in this one.
        cur.execute("TRUNCATE ingest_metric")
    return stored


def _copy(statement: str, data: bytes) -> None:
    with connection.cursor() as cur:
        raw = cur.cursor  # psycopg's cursor: COPY is not part of the DB-API
        with raw.copy(statement) as copy:
            copy.write(data)


# COPY's binary format: a signature, then per row the column count and each column as its
# length and big-endian bytes, then -1. Here it costs a third of the text format's formatting (no
# float repr, no timestamp text), and PostgreSQL parses no text either.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_TRAILER = struct.pack(">h", -1)
# 8 columns; job_id bigint, round_number integer, rank integer, seq bigint, step bigint.
_ROW_HEAD = struct.Struct(">hiqiiiiiqiq")
# value double precision, time timestamptz (microseconds since 2000-01-01 UTC).
_ROW_TAIL = struct.Struct(">idiq")
_PG_EPOCH_MICROS = 946_684_800_000_000


def copy_data(rows: list[MetricRow]) -> bytes:
    """Rows in COPY's binary format for telemetry_metric's columns (METRIC_COPY). A record's
    values come as consecutive rows sharing everything up to the name: that part is packed once
    per record. Times are kept to the microsecond, as ``to_timestamp`` keeps them."""
    names: dict[str, bytes] = {}
    parts = [_SIGNATURE]
    append = parts.append
    pack_tail = _ROW_TAIL.pack
    last: tuple[int, ...] = ()
    head = b""
    last_t = math.nan
    micros = 0
    for row in rows:
        key = row[:5]
        if key != last:
            last = key
            job, rnd, rank, seq, step = key
            head = _ROW_HEAD.pack(8, 8, job, 4, rnd, 4, rank, 8, seq, 8, step)
        t = row[7]
        if t != last_t:
            last_t = t
            micros = round(t * 1_000_000) - _PG_EPOCH_MICROS
        name = row[5]
        segment = names.get(name)
        if segment is None:
            encoded = name.encode()
            segment = names[name] = len(encoded).to_bytes(4, "big") + encoded
        append(head + segment + pack_tail(8, row[6], 8, micros))
    append(_TRAILER)
    return b"".join(parts)


def tile_rows(rows: list[MetricRow]) -> list[TileRow]:
    """The 100-step tiles of ``rows``, as the dedupe path's SQL computes them: min and max with
    PostgreSQL's ordering of NaN (above every number), so both paths agree. Sorted by key, the
    order every writer locks them in."""
    tiles: dict[tuple[int, int, int, str, int], list[Any]] = {}
    for job, rnd, rank, _seq, step, name, value, t in rows:
        key = (job, rnd, rank, name, step - step % ROLLUP_STEPS)
        tile = tiles.get(key)
        if tile is None:
            tiles[key] = [step, value, value, value, 1, t, t]
            continue
        if step > tile[0]:
            tile[0] = step
        if value < tile[1] or tile[1] != tile[1]:  # NaN is the minimum only of all-NaN tiles
            tile[1] = value
        if value > tile[2] or value != value:  # and the maximum of any tile holding one
            tile[2] = value
        tile[3] += value
        tile[4] += 1
        if t < tile[5]:
            tile[5] = t
        elif t > tile[6]:
            tile[6] = t
    return [(*key, *tile) for key, tile in sorted(tiles.items())]  # type: ignore[misc]


def upsert_tiles(tiles: list[TileRow]) -> None:
    if not tiles:
        return
    columns = [list(column) for column in zip(*tiles, strict=True)]
    with connection.cursor() as cur:
        cur.execute(TILE_UPSERT, columns)


def store_logs(rows: list[LogRow]) -> list[StoredLog]:
    """Store log lines; returns those not stored before, with their ids (the live tail's)."""
    with connection.cursor() as cur:
        raw = cur.cursor
        raw.execute(LOG_TEMP)
        with raw.copy(
            "COPY ingest_log (job_id, round_number, rank, stream, seq, text, t) FROM STDIN"
        ) as copy:
            for job, rnd, rank, stream, seq, text, t in rows:
                # PostgreSQL text cannot hold NUL; a binary blob on stdout must not stall ingest.
                copy.write_row((job, rnd, rank, stream, seq, text.replace("\x00", "\ufffd"), t))
        raw.execute(LOG_INSERT)
        stored: list[StoredLog] = raw.fetchall()
    return stored


def store_checkpoints(rows: list[CheckpointRow]) -> None:
    if not rows:
        return
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                job_id=job, round_number=rnd, step=step, path=path, size_bytes=size, blocking_ms=blocking
            )
            for job, rnd, step, path, size, blocking in rows
        ],
        ignore_conflicts=True,
    )


def store_events(rows: list[EventRow]) -> None:
    for row in rows:
        emit_once(
            row.key,
            row.kind,
            row.message,
            job=Job(pk=row.job_id, round_number=row.round_number),
            round_number=row.round_number,
            severity=row.severity,
            rank=row.rank,
            **row.data,
        )
