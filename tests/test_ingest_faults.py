"""Ingest rides out PostgreSQL and Redis failures: it goes on by itself, and every point is
stored exactly once (raw rows and tiles), nothing acked before its commit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.db.models import Sum

from console.jobs.models import Job
from console.telemetry.ingest import loop as loop_module
from console.telemetry.ingest.loop import IngestLoop
from console.telemetry.models import LogLine, Metric, MetricRollup
from tests.support.services import RedisServer
from tests.support.telemetry import allocate, batch, metric_records, xadd
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

STEPS_PER_BATCH = 50


@pytest.fixture
def job() -> Job:
    job = Job.objects.create(name="faults", workload="mlp", round_number=1)
    allocate(job)
    return job


class Running:
    """The ingest loop on a thread, as ``manage.py ingest`` runs it."""

    def __init__(self, loop: IngestLoop) -> None:
        self.loop = loop
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.crashed: BaseException | None = None
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run(self.stopping.is_set)
        except BaseException as exc:  # the test fails on it: run() must never give up
            self.crashed = exc
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.loop.close()
        assert self.crashed is None, f"the loop died: {self.crashed!r}"


@pytest.fixture
def running() -> Iterator[Callable[[IngestLoop], Running]]:
    started: list[Running] = []

    def start(loop: IngestLoop) -> Running:
        started.append(Running(loop))
        return started[-1]

    yield start
    for run in started:
        if run.thread.is_alive():
            run.stop()


def send_batches(client: redis.Redis, job: Job, first: int, count: int, ranks: int = 2) -> None:
    """``count`` batches of STEPS_PER_BATCH steps per rank, steps from ``first`` on; each value
    is step/2 + rank, so a stored row can be checked against what was sent."""
    for i in range(count):
        steps = range(first + i * STEPS_PER_BATCH, first + (i + 1) * STEPS_PER_BATCH)
        for rank in range(ranks):
            records = metric_records(steps, {"loss": lambda s, r=rank: s / 2 + r, "lr": 0.1})
            payload = batch(job.pk, records, rank=rank)
            while True:  # as the agent's shipper does while Redis is away
                try:
                    xadd(client, payload)
                    break
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.1)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pending(client: redis.Redis) -> int:
    """Entries read and not acked (0 before the group exists)."""
    try:
        return int(client.xpending(TELEMETRY_STREAM, TELEMETRY_GROUP)["pending"])
    except redis.ResponseError:
        return 0


def paused(caplog: pytest.LogCaptureFixture) -> int:
    """How often the loop paused on a failure (it logs each one, then retries)."""
    return sum("ingest paused" in r.getMessage() for r in caplog.records)


def stored(job: Job) -> int:
    return Metric.objects.filter(job=job, name="loss").count()


def assert_stored_once(job: Job, steps: int, ranks: int = 2) -> None:
    """Every (rank, step) of loss and lr stored once, and counted once in the tiles."""
    rows = list(Metric.objects.filter(job=job, name="loss").values_list("rank", "step", "value"))
    assert len(rows) == steps * ranks
    assert set(rows) == {(r, s, s / 2 + r) for r in range(ranks) for s in range(steps)}
    assert Metric.objects.filter(job=job, name="lr").count() == steps * ranks
    tiles = MetricRollup.objects.filter(job=job)
    assert tiles.aggregate(n=Sum("count"))["n"] == 2 * steps * ranks
    for tile in tiles.filter(name="loss"):
        first, last = tile.bucket_step, tile.bucket_step + 99
        assert (tile.min_value, tile.max_value, tile.count) == (
            first / 2 + tile.rank,
            last / 2 + tile.rank,
            100,
        )


def terminate_other_backends() -> int:
    """What a PostgreSQL restart does to ingest: every connection but the test's own is cut."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(settings.REDIS_URL)
    c.delete(TELEMETRY_STREAM)
    yield c
    c.delete(TELEMETRY_STREAM)
    c.close()


def test_a_write_postgresql_refuses_stays_pending_with_everything_behind_it(
    client: redis.Redis, job: Job, running: Callable[[IngestLoop], Running], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a running ingest reading one entry at a time (so later entries queue behind a write)
    run = running(IngestLoop(client, "refused", read_count=1))
    send_batches(client, job, 0, 2)
    wait_for(lambda: Metric.objects.filter(job=job).count() == 2 * 2 * 2 * STEPS_PER_BATCH, 30, "first rows")
    # and PostgreSQL refusing one log line (a trigger: the database itself says no)
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN "
            "IF NEW.text = 'poison' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cur.execute(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON telemetry_logline "
            "FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
        )

    # When that line arrives, and more points after it
    xadd(client, batch(job.pk, [{"kind": "log", "seq": 1, "t": 1.0, "stream": "stdout", "text": "poison"}]))
    send_batches(client, job, 2 * STEPS_PER_BATCH, 2)
    # (not a sleep: until the loop has tried again twice since, each try refused; it never reads
    # past a pending entry it cannot store, so the entries behind it are not read either)
    caplog.set_level(logging.WARNING, logger=loop_module.__name__)
    refusals = paused(caplog)
    wait_for(lambda: paused(caplog) >= refusals + 2, 30, "two more refused tries")

    # Then nothing of that entry or behind it is stored or acked, and the loop keeps going
    assert not Metric.objects.filter(job=job, step__gte=2 * STEPS_PER_BATCH).exists()
    assert pending(client) >= 1
    assert run.thread.is_alive()

    # and once PostgreSQL accepts the line, everything is stored exactly once
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER refuse_poison ON telemetry_logline")
        cur.execute("DROP FUNCTION refuse_poison()")
    wait_for(lambda: stored(job) == 2 * 4 * STEPS_PER_BATCH, 30, "every point")
    wait_for(lambda: pending(client) == 0, 30, "every entry acked")
    run.stop()
    assert list(LogLine.objects.filter(job=job).values_list("text", flat=True)) == ["poison"]
    assert_stored_once(job, 4 * STEPS_PER_BATCH)


def test_lost_database_connections_lose_and_duplicate_nothing(
    client: redis.Redis, job: Job, running: Callable[[IngestLoop], Running]
) -> None:
    # Given a running ingest taking a stream of batches from two ranks
    batches = 200
    run = running(IngestLoop(client, "pg-cut", read_count=4))
    producer = threading.Thread(target=send_batches, args=(client, job, 0, batches))
    producer.start()

    # When its database connections are cut again and again while it writes (as a PostgreSQL
    # fast shutdown and restart would: every backend ends, mid-transaction or idle), each time
    # once it has stored a little more
    cuts, seen = 0, 0
    deadline = time.monotonic() + 60
    while cuts < 8 and stored(job) < 2 * batches * STEPS_PER_BATCH and time.monotonic() < deadline:
        now = stored(job)
        if now > seen:
            seen = now
            cuts += terminate_other_backends()
        time.sleep(0.1)
    producer.join(30)
    assert cuts >= 3, "the test cut too few connections to mean anything"

    # Then it goes on by itself: every entry is acked, every point stored and tiled once
    wait_for(lambda: stored(job) == 2 * batches * STEPS_PER_BATCH, 60, "every point")
    wait_for(lambda: pending(client) == 0, 30, "every entry acked")
    run.loop.writer.wait_idle()
    run.stop()
    assert_stored_once(job, batches * STEPS_PER_BATCH)


def test_redis_restart_loses_and_duplicates_nothing(
    tmp_path: Path, job: Job, running: Callable[[IngestLoop], Running]
) -> None:
    # Given an ingest on its own Redis (append-only, as docker-compose configures it)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=1)
        run = running(IngestLoop(client, "redis-restart", read_count=4))
        send_batches(client, job, 0, 10)
        wait_for(lambda: Metric.objects.filter(job=job).exists(), 30, "first rows")

        # When Redis stops for two seconds while entries are pending, then comes back
        server.restart(down_for=2.0)
        send_batches(client, job, 10 * STEPS_PER_BATCH, 10)

        # Then the ingest reconnects by itself and stores everything exactly once
        wait_for(lambda: stored(job) == 2 * 20 * STEPS_PER_BATCH, 60, "every point")
        wait_for(lambda: pending(client) == 0, 30, "every entry acked")
        run.loop.writer.wait_idle()
        run.stop()
        assert_stored_once(job, 20 * STEPS_PER_BATCH)
        client.close()
    finally:
        server.stop()
