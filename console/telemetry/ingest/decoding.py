"""Wire decoding: stream entries (agents' JSON batches, format in workers/protocol.py and
workers/agent/shipper.py) into typed rows, one list per table. No Redis, no database.

An entry holds the fields ``batch`` (the JSON), ``node`` and ``mac`` (its seal). Ingest decodes
in two steps with its check in between: ``open_batch`` reads a batch's head (job, round, rank) and
its records, ``trust.Gate`` keeps the batches sealed by the node their rank is allocated to, and
``decode_batches`` turns what it kept into rows. ``decode_entries`` does both steps without the
check, for benches and tests that make rows of their own.

A batch whose envelope is unusable is dropped whole (``BadBatch``, logged); a bad record inside a
good batch is skipped and counted, never fatal: one odd line from a training script must not
hold back the points around it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from console.telemetry.models import Severity

log = logging.getLogger(__name__)

# (job, round, rank, seq, step, name, value, t): one scalar a rank logged.
MetricRow = tuple[int, int, int, int, int, str, float, float]
# (job, round, rank, stream, seq, text, t)
LogRow = tuple[int, int, int, str, int, str, float]
# (job, round, step, path, size_bytes, blocking_ms)
CheckpointRow = tuple[int, int, int, str, int, float]

MAX_NAME = 128  # telemetry_metric.name
# Column ranges (bigint, integer): a value past them would fail every write of its read.
MAX_BIGINT = 2**63 - 1
MAX_INTEGER = 2**31 - 1
# Times an agent may report (epoch seconds, up to the year 2200); others become "now".
MAX_TIME = 7_258_118_400.0
MAX_PATH = 1024  # jobs_checkpoint.path
MAX_EVENT_KIND = 64  # telemetry_event.kind
LOG_STREAMS = ("stdout", "stderr")


class BadBatch(ValueError):
    """A batch or record that cannot be used."""


@dataclass(frozen=True)
class EventRow:
    """An event a rank reported, or the agent's note that it dropped points (kind "dropped")."""

    key: str  # the Event's dedupe_key: a replayed record stores nothing twice
    job_id: int
    round_number: int
    rank: int
    kind: str
    severity: str
    message: str
    data: dict[str, Any]


@dataclass
class Decoded:
    """The rows of one read, grouped by table."""

    metrics: list[MetricRow] = field(default_factory=list)
    logs: list[LogRow] = field(default_factory=list)
    checkpoints: list[CheckpointRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    job_ids: set[int] = field(default_factory=set)
    records: int = 0
    bad_records: int = 0


@dataclass(frozen=True)
class Head:
    """What a batch's envelope says about all of its records."""

    job_id: int
    round_number: int
    rank: int


# A batch's head and its records, not yet decoded.
Opened = tuple[Head, list[Any]]


def decode_entries(entries: Iterable[tuple[bytes, dict[bytes, bytes]]]) -> Decoded:
    """Every entry of one read, decoded with its seal unchecked (benches, tests); malformed
    entries and records are logged and skipped. Ingest decodes only what ``trust.Gate`` admits."""
    return decode_batches(
        batch for entry_id, fields in entries if (batch := open_entry(entry_id, fields.get(b"batch")))
    )


def open_entry(entry_id: bytes, raw: bytes | None) -> Opened | None:
    """An entry's batch opened; None (logged) when it has none or its envelope is unusable."""
    try:
        if raw is None:
            raise BadBatch("no batch field")
        return open_batch(raw)
    except BadBatch as exc:
        log.warning("dropping malformed telemetry entry %s: %s", entry_id.decode(), exc)
        return None


def open_batch(raw: bytes | str) -> Opened:
    """A batch's head and records; raises BadBatch when the envelope is unusable."""
    try:
        batch = _loads(raw)
        head = Head(
            _count(batch, "job_id"), _count(batch, "round", MAX_INTEGER), _count(batch, "rank", MAX_INTEGER)
        )
        records = batch["records"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadBatch(str(exc)) from exc
    if not isinstance(records, list):
        raise BadBatch("records must be a list")
    return head, records


def decode_batches(batches: Iterable[Opened]) -> Decoded:
    """The rows of opened batches; malformed records are counted, logged and skipped."""
    decoded = Decoded()
    for head, records in batches:
        decode_records(head, records, decoded)
    if decoded.bad_records:
        log.warning("skipped %d malformed telemetry records", decoded.bad_records)
    return decoded


def decode_records(head: Head, records: list[Any], into: Decoded) -> None:
    """Add one batch's records to ``into``."""
    into.job_ids.add(head.job_id)
    for record in records:
        into.records += 1
        try:
            _RECORD_KINDS[record["kind"]](head, record, into)
        except (BadBatch, KeyError, TypeError, AttributeError, ValueError):
            into.bad_records += 1


def _loads(raw: bytes | str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Python's json also reads what orjson refuses: NaN and Infinity literals (Python's
        # json.dumps writes them, e.g. in an event's data), integers past 64 bits.
        return json.loads(raw)


def _count(record: dict[str, Any], key: str, limit: int = MAX_BIGINT) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise BadBatch(f"{key} must be an integer from 0 to {limit}")
    return value


def _time(record: dict[str, Any]) -> float:
    value = record.get("t")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_TIME:
        return time.time()
    return float(value)


def _metric(head: Head, record: dict[str, Any], into: Decoded) -> None:
    seq, step, t = _count(record, "seq"), _count(record, "step"), _time(record)
    job, rnd, rank = head.job_id, head.round_number, head.rank
    append = into.metrics.append
    for name, value in record["values"].items():
        # (Most values are floats: one type check for them, the rest of the checks after.)
        if type(value) is not float:
            if value is None:
                # The SDK sends a NaN/Inf as null (JSON has neither): keep it, as NaN, so the
                # chart shows the gap and the loss detector sees the divergence.
                value = math.nan
            elif isinstance(value, bool) or not isinstance(value, int):
                into.bad_records += 1
                continue
            value = float(value)
        if len(name) > MAX_NAME or "\x00" in name:  # (PostgreSQL text cannot hold NUL)
            into.bad_records += 1
            continue
        append((job, rnd, rank, seq, step, name, value, t))


def _log(head: Head, record: dict[str, Any], into: Decoded) -> None:
    stream = record.get("stream", "stdout")
    if stream not in LOG_STREAMS:
        raise BadBatch("stream must be stdout or stderr")
    into.logs.append(
        (
            head.job_id,
            head.round_number,
            head.rank,
            stream,
            _count(record, "seq"),
            str(record["text"]),
            _time(record),
        )
    )


def _checkpoint(head: Head, record: dict[str, Any], into: Decoded) -> None:
    _count(record, "seq")
    into.checkpoints.append(
        (
            head.job_id,
            head.round_number,
            _count(record, "step"),
            str(record["path"])[:MAX_PATH],
            int(record.get("size_bytes") or 0),
            float(record.get("blocking_ms") or 0.0),
        )
    )


def _event(head: Head, record: dict[str, Any], into: Decoded) -> None:
    kind = str(record.get("event") or "event")[:MAX_EVENT_KIND]
    severity = record.get("severity") or Severity.INFO
    raw_data = record.get("data")
    data = json_safe(raw_data) if isinstance(raw_data, dict) else {}
    into.events.append(
        EventRow(
            _record_key(head, "event", _count(record, "seq")),
            head.job_id,
            head.round_number,
            head.rank,
            kind,
            severity if severity in Severity.values else Severity.WARNING,
            str(record.get("message") or kind),
            {k: v for k, v in data.items() if k != "rank"},
        )
    )


def _dropped(head: Head, record: dict[str, Any], into: Decoded) -> None:
    count = json_safe(record.get("count"))
    into.events.append(
        EventRow(
            _record_key(head, "dropped", _count(record, "seq")),
            head.job_id,
            head.round_number,
            head.rank,
            "telemetry_dropped",
            Severity.WARNING,
            f"The agent dropped {count} metric points of rank {head.rank} (its buffer was full).",
            {"count": count},
        )
    )


def _record_key(head: Head, kind: str, seq: int) -> str:
    return f"record:{head.job_id}:{head.round_number}:{head.rank}:{kind}:{seq}"


_RECORD_KINDS: dict[str, Callable[[Head, dict[str, Any], Decoded], None]] = {
    "metric": _metric,
    "log": _log,
    "checkpoint": _checkpoint,
    "event": _event,
    "dropped": _dropped,
}


def json_safe(value: Any) -> Any:
    """Agent-supplied data with NaN/Infinity replaced by None: jsonb and browsers reject them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
