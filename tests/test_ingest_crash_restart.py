"""Kill the ingest and restart Redis while a producer logs: the stored series equals what was logged."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.db import connection

from console.jobs.models import Job
from console.telemetry.models import Metric
from tests.support.services import RedisServer
from tests.support.telemetry import allocate, batch, child_env, metric_records, xadd
from workers.protocol import TELEMETRY_GROUP, TELEMETRY_STREAM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parent.parent
BATCHES = 240
STEPS_PER_BATCH = 25
RANKS = 2


class Producer(threading.Thread):
    """Logs like agents do: XADD each batch, retrying (buffering) while Redis is unreachable."""

    def __init__(self, url: str, job_id: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.job_id = job_id
        self.sent = 0
        self.retries = 0
        self.stop = threading.Event()
        # The producer holds at three quarters until the test has restarted Redis, so the
        # restart always happens while it is still logging.
        self.may_finish = threading.Event()

    def run(self) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=1)
        for i in range(BATCHES):
            rank = i % RANKS
            first = (i // RANKS) * STEPS_PER_BATCH
            payload = batch(
                self.job_id,
                metric_records(range(first, first + STEPS_PER_BATCH), {"loss": lambda s: s * 0.5 + 0.25}),
                rank=rank,
            )
            while not self.stop.is_set():
                try:
                    xadd(client, payload)
                    break
                except (redis.ConnectionError, redis.TimeoutError):
                    self.retries += 1
                    time.sleep(0.05)
            self.sent = i + 1
            if self.sent == 3 * BATCHES // 4:
                self.may_finish.wait(60)
            time.sleep(0.02)
        client.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def ingest_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.poll() is not None, f"ingest pid {proc.pid} still running"


def start_ingest(redis_url: str, log_path: Path) -> subprocess.Popen[bytes]:
    db = connection.settings_dict
    env = child_env(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        REDIS_URL=redis_url,
    )
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", "ingest", "--consumer", "crash-test"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_no_loss_no_duplicates_across_ingest_kill_and_redis_restart(
    redis_server: RedisServer, ingest_processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Given a job, a running ingest and a producer logging 2 ranks x 3000 steps
    job = Job.objects.create(name="crash", workload="mlp", round_number=1)
    allocate(job, nproc=RANKS)
    log_path = tmp_path / "ingest.log"
    ingest_processes.append(start_ingest(redis_server.url, log_path))
    producer = Producer(redis_server.url, job.pk)
    producer.start()

    # When the ingest is SIGKILLed mid-stream and started again
    wait_for(
        lambda: Metric.objects.filter(job=job).exists() and producer.sent >= BATCHES // 4, 60, "first rows"
    )
    ingest_processes[-1].send_signal(signal.SIGKILL)
    ingest_processes[-1].wait(10)
    time.sleep(0.5)
    ingest_processes.append(start_ingest(redis_server.url, log_path))

    # and Redis is restarted (down for a second) while both keep going
    wait_for(lambda: producer.sent >= BATCHES // 2, 60, "half of the batches")
    redis_server.restart(down_for=3.0)

    # and the ingest is killed once more right after
    wait_for(lambda: producer.sent >= 3 * BATCHES // 4, 60, "three quarters of the batches")
    ingest_processes[-1].send_signal(signal.SIGKILL)
    ingest_processes[-1].wait(10)
    ingest_processes.append(start_ingest(redis_server.url, log_path))
    producer.may_finish.set()
    producer.join(120)
    assert not producer.is_alive()

    expected = {
        (rank, step, step * 0.5 + 0.25)
        for i in range(BATCHES)
        for rank in [i % RANKS]
        for step in range((i // RANKS) * STEPS_PER_BATCH, (i // RANKS + 1) * STEPS_PER_BATCH)
    }
    wait_for(lambda: Metric.objects.filter(job=job).count() >= len(expected), 120, "every point stored")
    client = redis.Redis.from_url(redis_server.url)
    wait_for(lambda: client.xpending(TELEMETRY_STREAM, TELEMETRY_GROUP)["pending"] == 0, 30, "all acked")
    client.close()

    # Then the stored series is exactly what was logged: every step of every rank, once
    rows = list(Metric.objects.filter(job=job, name="loss").values_list("rank", "step", "value"))
    assert len(rows) == len(expected)
    assert set(rows) == expected
    # and the restarted Redis kept the stream: entries from before the restart are still there
    client = redis.Redis.from_url(redis_server.url)
    # (entries-added counts every XADD the stream ever took; acked entries are trimmed)
    assert client.xinfo_stream(TELEMETRY_STREAM)["entries-added"] >= BATCHES
    client.close()

    # and the ingest stops cleanly on SIGTERM (its loop sees the flag within a read)
    last = ingest_processes[-1]
    last.send_signal(signal.SIGTERM)
    assert last.wait(15) == 0
    assert "ingest crash-test stopped" in log_path.read_text()
