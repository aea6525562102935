"""Telemetry shipping: tails every rank's telemetry file and stdout/stderr logs and XADDs
batches to the Redis stream ``TELEMETRY_STREAM`` (format in workers/protocol.py). Each entry is
sealed with the node's report key (``signing.telemetry_entry``: the node's name and an HMAC over it
and the batch's bytes): ingest stores a batch only when the seal verifies and the batch's rank is
one the console allocated to this node in that round, so nobody else who can write to the stream
can put telemetry into a job.

Training never waits on this: ranks only append to local files, and one thread here reads
them every SHIP_INTERVAL_SECONDS. When Redis is unreachable the thread keeps reading into an
in-memory buffer of at most MAX_BUFFERED_RECORDS records (about 200,000 x a few hundred bytes,
well under 100 MB). Past that bound it drops the OLDEST metric records (a later point of the
same curve is worth more than an old one) and leaves a ``{"kind": "dropped", "count": N}``
record where they were; events and checkpoint records are never dropped, and log lines only
when nothing else is left to drop (they stay in the rank's local log file anyway). On
reconnect everything buffered is sent in order. Delivery is at-least-once: a batch whose XADD
failed half-way is sent again, and ingest de-duplicates by (rank, kind, seq).

A SIGKILLed agent loses what it had read but not sent (and what its ranks wrote in their last
instant). So each rank's directory holds a ``shipping.json`` marker (its job, round and rank)
from the moment it is tailed until everything read from it has been sent; an agent that starts
on the same data directory ships every marked rank's files again from the start
(``resume_unshipped``). Sequence numbers are counted from the start of each file, so what had
been sent already carries the same keys and ingest drops it. A rank carried into an in-place
round goes on in the same files under a new key: the marker lists each key with the offsets
(and line and sequence counts) where its part of the files began, and a resume ships each part
under its own key, as the live agent did.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from workers.agent.tensorboard import ScalarFiles, marker_scalars
from workers.protocol import TELEMETRY_STREAM
from workers.signing import telemetry_entry

logger = logging.getLogger(__name__)

MAX_BUFFERED_RECORDS = 200_000
"""Records held while Redis is unreachable before the oldest metric records are dropped."""
SHIP_INTERVAL_SECONDS = 0.05
"""How often the rank files are read: at most this long added to a point's way to the browser;
each tick costs one read() per file."""
MAX_BATCH_RECORDS = 500
"""Records per XADD entry: keeps one stream entry well under a megabyte for ingest."""
MAX_RECORDS_PER_SEND = 20_000
"""Records per pipeline round trip, so a long backlog drains in steps and reading goes on."""
RETRY_SECONDS = 1.0
MAX_LOG_LINE_CHARS = 8_192
MARKER = "shipping.json"
"""In a rank's directory while its files may hold records not yet sent."""

RoundKey = tuple[int, int]  # (job_id, round)
RankKey = tuple[int, int, int]  # (job_id, round, rank)


@dataclass
class _Tail:
    path: Path
    offset: int = 0
    partial: bytes = b""
    end: int | None = None  # a resumed part of the file stops here (the next key's start)

    @property
    def line_start(self) -> int:
        """Where the next whole line begins: the offset read up to, less a partial last line."""
        return self.offset - len(self.partial)

    def read_lines(self) -> list[bytes]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(-1 if self.end is None else max(0, self.end - self.offset))
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return lines


@dataclass
class _Source:
    key: RankKey
    telemetry: _Tail
    stdout: _Tail
    stderr: _Tail
    log_lines: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    seqs: dict[str, int] = field(default_factory=dict)
    finishing: bool = False
    marker: Path | None = None
    resumed: bool = False  # a rank of a previous agent's life: its files are complete
    next_key: RankKey | None = None  # carried into an in-place round: the key from the next read
    parts: list[dict[str, Any]] = field(default_factory=list)  # the marker's content
    keys: list[RankKey] = field(default_factory=list)  # every key its records went under
    scalars: ScalarFiles | None = None  # its TensorBoard event files (workers/agent/tensorboard.py)

    def part(self) -> dict[str, Any]:
        """Where the files' part under the current key begins (read on the shipper's thread)."""
        job_id, round_, rank = self.key
        return {
            "job_id": job_id,
            "round": round_,
            "rank": rank,
            "offsets": {
                "telemetry": self.telemetry.line_start,
                "stdout": self.stdout.line_start,
                "stderr": self.stderr.line_start,
            },
            "log_lines": dict(self.log_lines),
            "seqs": dict(self.seqs),
        }


@dataclass
class RoundProgress:
    last_step: int | None = None
    first_step_at: float | None = None
    total_steps: int | None = None  # sdk.progress(total): the newest total_steps logged


# The metric sdk.progress(total) logs (workers/sdk/__init__.py).
TOTAL_STEPS = "total_steps"


class TelemetryShipper(threading.Thread):
    def __init__(
        self, redis_url: str, node: str, key: bytes, max_buffered: int = MAX_BUFFERED_RECORDS
    ) -> None:
        """``key``: the node's report key (``signing.report_key`` of its credential), which seals
        every entry."""
        super().__init__(name="telemetry-shipper", daemon=True)
        self._max_buffered = max_buffered
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        self._node = node
        self._key = key
        self._lock = threading.Lock()
        self._sources: dict[RankKey, _Source] = {}
        self._progress: dict[RoundKey, RoundProgress] = {}
        self._rank_steps: dict[RankKey, int] = {}  # each rank's newest step (hang detection)
        self._buffer: collections.deque[tuple[RankKey, dict[str, Any]]] = collections.deque()
        self._pending: collections.Counter[RankKey] = collections.Counter()  # records buffered
        # finished sources whose marker awaits the send of every key they shipped under
        self._closing: dict[RankKey, tuple[Path, tuple[RankKey, ...]]] = {}
        self._stopping = threading.Event()
        self._retry_at = 0.0
        self.connected = True

    # --- called by the supervisor ------------------------------------------------------------
    def add(
        self,
        job_id: int,
        round_: int,
        rank: int,
        telemetry: Path,
        stdout: Path,
        stderr: Path,
        *,
        scalars: ScalarFiles | None = None,
    ) -> None:
        key = (job_id, round_, rank)
        source = _Source(
            key,
            _Tail(telemetry),
            _Tail(stdout),
            _Tail(stderr),
            marker=telemetry.parent / MARKER,
            scalars=scalars,
        )
        source.parts, source.keys = [source.part()], [key]
        write_marker(source)
        with self._lock:
            self._sources[key] = source
            self._progress.setdefault((job_id, round_), RoundProgress())

    def resume_unshipped(self, rounds_dir: Path) -> int:
        """Ships again, from the start, the files of every rank a previous agent on this data
        directory had not finished sending (its ranks are dead: the reaper killed them with it),
        each part under the key it had. Returns how many ranks are resumed."""
        resumed = 0
        for marker in sorted(rounds_dir.glob(f"job-*/round-*/rank-*/{MARKER}")):
            try:
                parts = read_marker(marker)
            except (OSError, ValueError, KeyError, TypeError):
                logger.warning("telemetry: unreadable %s; removed", marker)
                marker.unlink(missing_ok=True)
                continue
            directory = marker.parent
            keys = [part_key(part) for part in parts]
            for index, part in enumerate(parts):
                following = parts[index + 1]["offsets"] if index + 1 < len(parts) else {}
                tails = {
                    name: _Tail(directory / file, int(part["offsets"][name]), end=following.get(name))
                    for name, file in (
                        ("telemetry", "telemetry.jsonl"),
                        ("stdout", "stdout.log"),
                        ("stderr", "stderr.log"),
                    )
                }
                last = index == len(parts) - 1
                source = _Source(
                    keys[index],
                    tails["telemetry"],
                    tails["stdout"],
                    tails["stderr"],
                    log_lines={"stdout": 0, "stderr": 0, **part["log_lines"]},
                    seqs=dict(part["seqs"]),
                    finishing=True,
                    marker=marker if last else None,  # removed once every part has been sent
                    resumed=True,
                    keys=keys if last else [keys[index]],
                    scalars=ScalarFiles.of_files(marker_scalars(marker)) if last else None,
                )
                with self._lock:
                    self._sources.setdefault(keys[index], source)
            resumed += 1
        if resumed:
            logger.info(
                "telemetry: shipping again the files of %d rank(s) a previous agent left unsent", resumed
            )
        return resumed

    def carry(self, old: RankKey, new: RankKey) -> None:
        """A rank survives into an in-place round: its files are tailed on from where they are,
        their new lines shipped under the new round and rank."""
        with self._lock:
            source = self._sources.pop(old, None)
            if source is None:
                return
            source.next_key = new  # taken on the shipper's thread, between two reads
            self._sources[new] = source
            # In place the steps go on: the new round starts from the old round's newest step
            # (logged after the last heartbeat, perhaps), not from nothing.
            before = self._progress.get((old[0], old[1]), RoundProgress())
            carried = self._progress.setdefault((new[0], new[1]), RoundProgress())
            if before.last_step is not None and (carried.last_step or -1) < before.last_step:
                carried.last_step = before.last_step
            if carried.total_steps is None:
                carried.total_steps = before.total_steps

    def finish(self, job_id: int, round_: int, rank: int) -> None:
        """The rank has exited: read its files to the end once more, then stop tailing them."""
        with self._lock:
            source = self._sources.get((job_id, round_, rank))
            if source is not None:
                source.finishing = True

    def progress(self, job_id: int, round_: int) -> RoundProgress:
        with self._lock:
            found = self._progress.get((job_id, round_))
            if found is None:
                return RoundProgress()
            return RoundProgress(found.last_step, found.first_step_at, found.total_steps)

    def forget_round(self, job_id: int, round_: int) -> None:
        with self._lock:
            self._progress.pop((job_id, round_), None)
            for key in [key for key in self._rank_steps if key[:2] == (job_id, round_)]:
                del self._rank_steps[key]

    def rank_step(self, job_id: int, round_: int, rank: int) -> int | None:
        """The newest step rank ``rank`` of the round logged (None: none yet)."""
        with self._lock:
            return self._rank_steps.get((job_id, round_, rank))

    def push(self, key: RankKey, records: list[dict[str, Any]]) -> None:
        """Records the agent made itself (resource samples: hangwatch.py) shipped with the rank's."""
        with self._lock:
            self._buffer.extend((key, record) for record in records)
            self._pending[key] += len(records)

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer)

    # --- the thread --------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.tick()
            self._stopping.wait(max(0.0, SHIP_INTERVAL_SECONDS - (time.monotonic() - started)))

    def stop(self, flush_timeout: float = 5.0) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=10)
        deadline = time.monotonic() + flush_timeout
        self._retry_at = 0.0
        self.tick()
        while self.buffered and time.monotonic() < deadline:
            time.sleep(0.2)
            self._retry_at = 0.0
            self.tick()

    def tick(self) -> None:
        try:
            self._read_sources()
            if time.monotonic() >= self._retry_at:
                self._send()
            self._release_markers()
        except Exception:
            logger.exception("telemetry shipping failed; retrying")

    # --- reading -----------------------------------------------------------------------------
    def _read_sources(self) -> None:
        with self._lock:
            sources = list(self._sources.values())
        now = time.time()
        for source in sources:
            if source.next_key is not None:
                self._switch_key(source)
            finishing = source.finishing
            records: list[dict[str, Any]] = []
            telemetry_lines = source.telemetry.read_lines()
            if finishing and source.telemetry.partial:
                # The rank is gone: a last line without its newline is all there will be.
                telemetry_lines.append(source.telemetry.partial)
                source.telemetry.partial = b""
            for line in telemetry_lines:
                record = self._telemetry_record(source, line, now)
                if record is not None:
                    records.append(record)
            if source.scalars is not None:
                records.extend(self._note_metric(source, r) for r in source.scalars.read(final=finishing))
                if source.scalars.changed:
                    source.scalars.changed = False
                    write_marker(source)
            for stream, tail in (("stdout", source.stdout), ("stderr", source.stderr)):
                lines = tail.read_lines()
                if finishing and tail.partial:
                    lines.append(tail.partial)
                    tail.partial = b""
                for raw in lines:
                    source.log_lines[stream] += 1
                    text = raw.decode("utf-8", errors="replace").rstrip("\r")[:MAX_LOG_LINE_CHARS]
                    records.append(
                        {
                            "kind": "log",
                            "seq": source.log_lines[stream],
                            "t": now,
                            "stream": stream,
                            "text": text,
                        }
                    )
            with self._lock:
                self._buffer.extend((source.key, record) for record in records)
                self._pending[source.key] += len(records)
                if finishing:
                    self._sources.pop(source.key, None)
                    if source.marker is not None:
                        self._closing[source.key] = (source.marker, tuple(source.keys))
                if len(self._buffer) > self._max_buffered:
                    self._drop_oldest()

    def _switch_key(self, source: _Source) -> None:
        """A carried rank's next lines go under its new key: the marker notes where they begin."""
        with self._lock:
            new, source.next_key = source.next_key, None
        assert new is not None
        source.key = new
        source.keys.append(new)
        source.parts.append(source.part())
        write_marker(source)

    def _telemetry_record(self, source: _Source, line: bytes, now: float) -> dict[str, Any] | None:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            return None
        kind = record["kind"]
        if "seq" not in record:
            source.seqs[kind] = source.seqs.get(kind, 0) + 1
            record["seq"] = source.seqs[kind]
        record.setdefault("t", now)
        return self._note_metric(source, record)

    def _note_metric(self, source: _Source, record: dict[str, Any]) -> dict[str, Any]:
        """A metric record's step is the round's progress (heartbeats carry it)."""
        if record["kind"] == "metric" and isinstance(record.get("step"), int) and not source.resumed:
            job_id, round_, _ = source.key
            with self._lock:
                progress = self._progress.setdefault((job_id, round_), RoundProgress())
                values = record.get("values")
                total = values.get(TOTAL_STEPS) if isinstance(values, dict) else None
                if isinstance(total, int | float) and not isinstance(total, bool) and total >= 1:
                    progress.total_steps = int(total)
                if isinstance(values, dict) and set(values) == {TOTAL_STEPS}:
                    return record  # logged at step 0 whatever the step: not a step taken
                if progress.last_step is None or record["step"] > progress.last_step:
                    progress.last_step = record["step"]
                if record["step"] > self._rank_steps.get(source.key, -1):
                    self._rank_steps[source.key] = record["step"]
                if progress.first_step_at is None:
                    progress.first_step_at = float(record["t"])
        return record

    def _drop_oldest(self) -> None:
        """Called with the lock held. Drops oldest metric records (then log lines) down to 90%
        of the bound, so the cost of rebuilding the deque is paid once per 20,000 records."""
        excess = len(self._buffer) - (self._max_buffered - self._max_buffered // 10)
        for droppable in ("metric", "log"):
            if excess <= 0:
                break
            markers: dict[RankKey, dict[str, Any]] = {}
            kept: collections.deque[tuple[RankKey, dict[str, Any]]] = collections.deque()
            for key, record in self._buffer:
                if excess > 0 and record["kind"] == droppable:
                    excess -= 1
                    marker = markers.get(key)
                    if marker is None:
                        marker = {"kind": "dropped", "seq": record["seq"], "t": record["t"], "count": 0}
                        markers[key] = marker
                        kept.append((key, marker))
                        excess += 1
                    marker["count"] += 1
                    continue
                kept.append((key, record))
            self._buffer = kept
        self._pending = collections.Counter(key for key, _ in self._buffer)

    # --- sending -----------------------------------------------------------------------------
    def _send(self) -> None:
        while True:
            with self._lock:
                if not self._buffer:
                    return
                chunk = [self._buffer[i] for i in range(min(MAX_RECORDS_PER_SEND, len(self._buffer)))]
            batches: dict[RankKey, list[list[dict[str, Any]]]] = {}
            for key, record in chunk:
                per_key = batches.setdefault(key, [[]])
                if len(per_key[-1]) >= MAX_BATCH_RECORDS:
                    per_key.append([])
                per_key[-1].append(record)
            pipe = self._redis.pipeline(transaction=False)
            for (job_id, round_, rank), groups in batches.items():
                for records in groups:
                    batch = {
                        "job_id": job_id,
                        "round": round_,
                        "rank": rank,
                        "node": self._node,
                        "records": records,
                    }
                    entry = telemetry_entry(self._key, self._node, json.dumps(batch))
                    pipe.xadd(TELEMETRY_STREAM, entry)
            try:
                pipe.execute()
            except redis.RedisError as exc:
                if self.connected:
                    logger.warning("telemetry: Redis unreachable (%s); buffering", exc)
                self.connected = False
                self._retry_at = time.monotonic() + RETRY_SECONDS
                return
            if not self.connected:
                logger.info("telemetry: Redis reachable again")
            self.connected = True
            with self._lock:
                # Only this thread removes from the left, so the chunk is still at the front
                # unless _drop_oldest rebuilt the deque meanwhile (it runs on this thread too).
                for _ in range(len(chunk)):
                    key, _record = self._buffer.popleft()
                    self._pending[key] -= 1

    def _release_markers(self) -> None:
        """Removes the marker of every finished rank whose records have all been sent."""
        with self._lock:
            done = [
                key for key, (_, keys) in self._closing.items() if all(self._pending[k] <= 0 for k in keys)
            ]
            closed = [self._closing.pop(key) for key in done]
            for _, keys in closed:
                for key in keys:
                    self._pending.pop(key, None)
        for marker, _ in closed:
            marker.unlink(missing_ok=True)


def write_marker(source: _Source) -> None:
    if source.marker is None:
        return
    content: dict[str, Any] = {"parts": source.parts}
    if source.scalars is not None and source.scalars.paths:
        content["tensorboard"] = source.scalars.paths
    try:
        source.marker.write_text(json.dumps(content))
    except OSError as exc:
        logger.warning(
            "telemetry: cannot write %s (%s); a crash may lose this rank's last lines", source.marker, exc
        )


def read_marker(marker: Path) -> list[dict[str, Any]]:
    """The marker's parts, first key first; a marker of one key (no "parts") is one part from 0."""
    found = json.loads(marker.read_text())
    if "parts" not in found:
        zero = {"telemetry": 0, "stdout": 0, "stderr": 0}
        return [{**found, "offsets": zero, "log_lines": {}, "seqs": {}}]
    parts = list(found["parts"])
    if not parts:
        raise ValueError("a marker without parts")
    for part in parts:  # every part names its key and its offsets (KeyError, ValueError if not)
        part_key(part)
        part["offsets"] = {name: int(part["offsets"][name]) for name in ("telemetry", "stdout", "stderr")}
    return parts


def part_key(part: dict[str, Any]) -> RankKey:
    return (int(part["job_id"]), int(part["round"]), int(part["rank"]))
