"""The ingest loop, the one both ``manage.py ingest`` and the tests run: read, check each
entry's seal and allocation (trust.py), decode, store, commit, ack, send live frames; and after
any failure (Redis or PostgreSQL gone, restarted or refusing a write) back off, re-read what is
not acked, and go on. Refused entries are acked with the rest of their read, never stored.

Two threads share the work. The loop's own thread reads the stream and decodes (CPU), while a
writer thread stores, commits and acks the previous read (mostly waiting on PostgreSQL, with
the GIL released). One writer and a FIFO queue keep the order. Entries are acked strictly after
their commit, so a failure anywhere leaves them pending: the writer skips everything queued
behind a failed write, the loop sees the failure, rewinds the cursor to its pending entries and
reads them again as a replay, which storage applies exactly once (see storage).

First deliveries' rank-0 points reach the live frames as soon as they are decoded, before their
commit: viewers should not wait for PostgreSQL (a commit under load took hundreds of ms here). If
that write then fails, the replay sends only what the database did not have, and a chart draws
any point it gets twice at the same place.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import redis
from django.db import DatabaseError, connection

from console.telemetry.anomalies import AnomalyDetector
from console.telemetry.fanout import busy_key
from console.telemetry.ingest.broadcast import Discard
from console.telemetry.ingest.cursor import BLOCK_MS, READ_COUNT, Read, StreamCursor
from console.telemetry.ingest.decoding import Decoded, decode_batches
from console.telemetry.ingest.frames import FRAME_INTERVAL, Frames, FrameSink
from console.telemetry.ingest.stats import IngestStats
from console.telemetry.ingest.storage import MetricBatch, ended_jobs, known_jobs, only_jobs, store_read
from console.telemetry.ingest.trust import Gate
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

log = logging.getLogger(__name__)

# Back-off after a failure: long enough not to spin, short enough that a restarted Redis or
# PostgreSQL is noticed within a second or two.
RETRY_MIN = 0.2
RETRY_MAX = 2.0
# Reads decoded ahead of the writer. Two keep PostgreSQL busy while the next read is decoded;
# more would only hold more unacked entries in memory.
PIPELINE_DEPTH = 2
# How often per-job state (frames, anomaly detectors) of jobs that have ended is dropped.
FORGET_EVERY = 10.0


@dataclass
class Batch:
    """One read, decoded and ready for the writer."""

    read: Read
    decoded: Decoded
    metrics: MetricBatch
    refused: collections.Counter[str] = field(default_factory=collections.Counter)  # by trust.Refusal


class ForgetEnded:
    """Asks the writer to drop the state of jobs that have ended (it owns the detectors)."""


class Writer:
    """Stores, commits and acks batches in order on its own thread. After a failed write it skips
    everything queued behind it (none of it acked) until the loop takes the error."""

    def __init__(self, ingest: IngestLoop, depth: int = PIPELINE_DEPTH) -> None:
        self.ingest = ingest
        self.detector = AnomalyDetector()
        self.queue: queue.Queue[Batch | ForgetEnded | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.commits = 0
        self.thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
        self.thread.start()

    def submit(self, item: Batch | ForgetEnded) -> None:
        self.queue.put(item)

    def wait_idle(self) -> None:
        self.queue.join()

    def take_error(self) -> BaseException | None:
        """The failure of a write, once everything queued behind it has been skipped."""
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
            while (item := self.queue.get()) is not None:
                try:
                    if self.error is not None:
                        continue
                    if isinstance(item, ForgetEnded):
                        self._forget_ended()
                    else:
                        self._write(item)
                except Exception as exc:
                    self.error = exc
                    connection.close()  # a broken connection must not be reused
                finally:
                    self.queue.task_done()
            self.queue.task_done()
        finally:
            connection.close()

    def _write(self, batch: Batch) -> None:
        ingest, read = self.ingest, batch.read
        stored = store_read(batch.decoded, batch.metrics, replay=read.replay, detector=self.detector)
        # Strictly after the commit: a failure before this line leaves the entries pending.
        ingest.cursor.ack(read.ids)
        self.commits += 1
        ingest.stats.count(
            entries=len(read.entries),
            records=batch.decoded.records,
            points=len(batch.metrics.rows),
            refused=batch.refused,
        )
        if read.replay:  # first deliveries went to the frames before the write
            ingest.frames.add_points(stored.points)
        ingest.frames.add_logs(stored.logs)
        ingest.frames.flush(ingest.sink)

    def _forget_ended(self) -> None:
        frames = self.ingest.frames
        try:
            ended = ended_jobs(self.detector.jobs() | frames.jobs())
        except DatabaseError:
            log.warning("could not look up ended jobs; trying again later", exc_info=True)
            connection.close()
            return
        for job_id in ended:
            self.detector.forget_job(job_id)
            frames.forget(job_id)


class IngestLoop:
    """One ingest consumer: ``run`` until told to stop (the daemon), or ``drain`` what the
    stream holds (tests, benches). Both turn the same loop."""

    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        *,
        sink: FrameSink | None = None,
        frame_interval: float = FRAME_INTERVAL,
        stream: str = TELEMETRY_STREAM,
        group: str = TELEMETRY_GROUP,
        read_count: int = READ_COUNT,
    ) -> None:
        self.consumer = consumer
        self.cursor = StreamCursor(client, consumer, stream=stream, group=group, count=read_count)
        self.gate = Gate()
        self.frames = Frames(frame_interval, busy=lambda job_id: bool(client.exists(busy_key(job_id))))
        self.sink: FrameSink = sink or Discard()
        self.stats = IngestStats(client, consumer)
        self.writer = Writer(self)
        self.last_read = 0
        self.last_forget = time.monotonic()

    def run(self, stop: Callable[[], bool], block_ms: int = BLOCK_MS) -> None:
        """Turn the loop until ``stop()``; a failure is logged, waited out and retried."""
        delay = RETRY_MIN
        while not stop():
            try:
                commits = self.writer.commits
                self.turn(block_ms)
                # Back to a short delay only once things work again: a write committed, or
                # nothing was there to write (a read that merely succeeds says nothing of
                # PostgreSQL).
                if self.writer.commits != commits or not self.last_read:
                    delay = RETRY_MIN
            except Exception as exc:
                self._recover(exc, delay, stop)
                delay = min(RETRY_MAX, delay * 2)

    def drain(self, timeout: float = 60.0) -> None:
        """Run until this consumer has nothing left to read or write: every entry in the stream
        stored and acked (or dropped as malformed or refused), failures retried on the way."""
        deadline = time.monotonic() + timeout

        def idle() -> bool:
            if time.monotonic() > deadline:
                raise TimeoutError("ingest did not drain the stream in time")
            if self.last_read:
                return False
            self.writer.wait_idle()
            return self.writer.error is None and not self.cursor.in_backlog

        self.last_read = -1  # (turn at least once)
        self.run(idle, block_ms=10)

    def turn(self, block_ms: int = BLOCK_MS) -> int:
        """One turn: read and decode the next entries, hand them to the writer, send the frames
        that are due, keep the books. Raises the writer's failure, if it had one."""
        error = self.writer.take_error()
        if error is not None:
            raise error
        read = self.cursor.read(block_ms)
        self.last_read = len(read.entries)
        if read.entries:
            self.writer.submit(self._prepare(read))
        self.frames.flush(self.sink)
        self.stats.maybe_report()
        self.cursor.maybe_trim()
        if time.monotonic() - self.last_forget >= FORGET_EVERY:
            self.last_forget = time.monotonic()
            self.writer.submit(ForgetEnded())
        return len(read.entries)

    def _prepare(self, read: Read) -> Batch:
        admitted = self.gate.admit(read.entries)
        decoded = decode_batches(admitted.batches)
        known = known_jobs(decoded.job_ids)
        if decoded.job_ids - known:
            log.warning("dropping telemetry for unknown jobs %s", sorted(decoded.job_ids - known))
            decoded = only_jobs(decoded, known)
        if not read.replay:
            self.frames.add_points(decoded.metrics)
        return Batch(read, decoded, MetricBatch.of(decoded.metrics), admitted.refused)

    def flush_frames(self, force: bool = False) -> None:
        self.frames.flush(self.sink, force)

    def _recover(self, exc: Exception, delay: float, stop: Callable[[], bool]) -> None:
        if isinstance(exc, redis.RedisError | DatabaseError | psycopg.Error):
            log.warning("ingest paused (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
        else:
            log.exception("ingest pass failed; its entries stay pending and are retried")
        # Whatever was queued behind a failed write is skipped unacked; wait for that (or for the
        # writer to finish what it holds), then read again from the oldest pending entry.
        self.writer.wait_idle()
        self.writer.take_error()
        connection.close()
        self.cursor.rewind()
        deadline = time.monotonic() + delay
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        """Finish what the writer holds (its thread ends) and send the last frames."""
        self.writer.close()
        self.flush_frames(force=True)
