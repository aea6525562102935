"""The agent's telemetry shipper rides out a Redis outage: it keeps reading into a bounded
buffer, drops the oldest metric points (never events or checkpoints) with a "dropped" record,
and sends everything it kept, in order, once Redis is reachable again. The outage is real: the
shipper talks to the real Redis through a TCP relay the test closes and reopens."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.agents import redis_url
from workers.agent.shipper import RETRY_SECONDS, TelemetryShipper
from workers.protocol import TELEMETRY_STREAM
from workers.signing import report_key, telemetry_mac_ok

KEY = report_key("tyn_shipper-test-secret")


class Relay:
    """Forwards a local TCP port to Redis; ``close`` makes Redis unreachable on that port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the
            # socket listening until that call returned.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()


@pytest.fixture
def relay() -> Iterator[Relay]:
    conn = redis.Redis.from_url(redis_url()).connection_pool.connection_kwargs
    relay = Relay((conn.get("host", "127.0.0.1"), int(conn.get("port", 6379))))
    relay.open()
    yield relay
    relay.close()


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")


def test_shipper_buffers_through_an_outage_and_drops_only_old_metrics(relay: Relay, tmp_path: Path) -> None:
    real = redis.Redis.from_url(redis_url())
    real.delete(TELEMETRY_STREAM)
    db = redis.Redis.from_url(redis_url()).connection_pool.connection_kwargs.get("db", 0)
    shipper = TelemetryShipper(f"redis://127.0.0.1:{relay.port}/{db}", "host-t", KEY, max_buffered=100)
    telemetry, stdout, stderr = tmp_path / "telemetry.jsonl", tmp_path / "stdout.log", tmp_path / "stderr.log"
    for path in (telemetry, stdout, stderr):
        path.touch()
    shipper.add(81, 1, 0, telemetry, stdout, stderr)

    # Given Redis is unreachable
    relay.close()

    # When a rank logs 150 metric points, 3 events and 2 checkpoints
    records: list[dict[str, Any]] = []
    for step in range(1, 151):
        records.append(
            {"kind": "metric", "seq": step, "t": time.time(), "step": step, "values": {"loss": 1.0}}
        )
        if step in (10, 75, 140):
            records.append({"kind": "event", "seq": step // 10, "event": "spike", "severity": "warning"})
        if step in (50, 100):
            records.append(
                {"kind": "checkpoint", "seq": step // 50, "step": step, "path": "/c", "size_bytes": 1}
            )
    write_lines(telemetry, records)
    shipper.tick()

    # Then it holds at most its bound, having dropped the oldest metrics only
    assert not shipper.connected
    assert shipper.buffered <= 100
    assert shipper.progress(81, 1).last_step == 150

    # When more points arrive while Redis is still down, and then Redis comes back
    write_lines(telemetry, [{"kind": "metric", "seq": s, "step": s, "values": {}} for s in range(151, 161)])
    shipper.tick()
    relay.open()
    time.sleep(RETRY_SECONDS + 0.1)
    shipper.tick()

    # Then everything kept arrives in order, each entry sealed by the node, with one "dropped"
    # record counting the rest
    assert shipper.connected
    assert shipper.buffered == 0
    sent: list[dict[str, Any]] = []
    for _id, fields in real.xrange(TELEMETRY_STREAM):  # type: ignore[union-attr]
        assert fields[b"node"] == b"host-t"
        assert telemetry_mac_ok(KEY, "host-t", fields[b"batch"], fields[b"mac"])
        batch = json.loads(fields[b"batch"])
        assert (batch["job_id"], batch["round"], batch["rank"], batch["node"]) == (81, 1, 0, "host-t")
        sent.extend(batch["records"])
    dropped = [r for r in sent if r["kind"] == "dropped"]
    metrics = [r["step"] for r in sent if r["kind"] == "metric"]
    assert len(dropped) == 1
    assert dropped[0]["count"] + len(metrics) == 160
    assert metrics == list(range(161 - len(metrics), 161))  # the newest points survived, in order
    assert [r["seq"] for r in sent if r["kind"] == "event"] == [1, 7, 14]
    assert [r["step"] for r in sent if r["kind"] == "checkpoint"] == [50, 100]
    assert sent[0]["kind"] == "dropped" or sent.index(dropped[0]) < sent.index(
        next(r for r in sent if r["kind"] == "metric")
    )
    shipper.stop(flush_timeout=1)
    real.delete(TELEMETRY_STREAM)


def sent_records(real: redis.Redis) -> list[tuple[tuple[int, int, int], dict[str, Any]]]:
    out: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    entries: list[tuple[bytes, dict[bytes, bytes]]] = real.xrange(TELEMETRY_STREAM)  # type: ignore[assignment]
    for _id, fields in entries:
        batch = json.loads(fields[b"batch"])
        out.extend(((batch["job_id"], batch["round"], batch["rank"]), r) for r in batch["records"])
    return out


def test_a_restarted_agent_ships_what_a_killed_one_left_unsent(tmp_path: Path) -> None:
    real = redis.Redis.from_url(redis_url())
    real.delete(TELEMETRY_STREAM)
    rank_dir = tmp_path / "job-5" / "round-2" / "rank-1"
    rank_dir.mkdir(parents=True)
    telemetry, stdout, stderr = rank_dir / "telemetry.jsonl", rank_dir / "stdout.log", rank_dir / "stderr.log"
    for path in (telemetry, stdout, stderr):
        path.touch()
    write_lines(telemetry, [{"kind": "metric", "step": s, "values": {"loss": 1.0}} for s in (1, 2)])
    stdout.write_text("line one\nline two\n")

    # Given an agent that tailed rank 3 and sent its first lines, then died (never stopped)
    first = TelemetryShipper(redis_url(), "host-r", KEY)
    first.add(5, 2, 3, telemetry, stdout, stderr)
    first.tick()
    assert (rank_dir / "shipping.json").exists()
    # ... while the rank wrote more it never read (its last instant)
    write_lines(telemetry, [{"kind": "metric", "step": 3, "values": {"loss": 0.5}}])
    with stdout.open("a") as fh:
        fh.write("line three\nlast words without a newline")

    # When an agent starts again on the same data directory
    second = TelemetryShipper(redis_url(), "host-r", KEY)
    assert second.resume_unshipped(tmp_path) == 1
    second.tick()

    # Then every record has been sent, the earlier ones again under the same keys (ingest
    # drops those), and the marker is gone so a third start sends nothing
    sent = sent_records(real)
    assert {key for key, _ in sent} == {(5, 2, 3)}
    keys = [(r["kind"], r["seq"]) for _, r in sent]
    assert sorted(set(keys)) == [
        ("log", 1),
        ("log", 2),
        ("log", 3),
        ("log", 4),
        ("metric", 1),
        ("metric", 2),
        ("metric", 3),
    ]
    assert len(keys) == 7 + 4  # the 4 records the first agent sent are sent again
    texts = {r["seq"]: r["text"] for _, r in sent if r["kind"] == "log"}
    assert texts[4] == "last words without a newline"
    assert not (rank_dir / "shipping.json").exists()
    assert TelemetryShipper(redis_url(), "host-r", KEY).resume_unshipped(tmp_path) == 0
    real.delete(TELEMETRY_STREAM)


def test_a_finished_rank_loses_its_marker_once_everything_is_sent(tmp_path: Path) -> None:
    real = redis.Redis.from_url(redis_url())
    real.delete(TELEMETRY_STREAM)
    telemetry, stdout, stderr = tmp_path / "telemetry.jsonl", tmp_path / "stdout.log", tmp_path / "stderr.log"
    for path in (telemetry, stdout, stderr):
        path.touch()
    shipper = TelemetryShipper(redis_url(), "host-f", KEY)
    shipper.add(6, 1, 0, telemetry, stdout, stderr)
    stdout.write_text("hello\n")
    shipper.tick()
    assert (tmp_path / "shipping.json").exists()  # still tailed: more may come

    shipper.finish(6, 1, 0)
    shipper.tick()

    assert not (tmp_path / "shipping.json").exists()
    assert [r["text"] for _, r in sent_records(real)] == ["hello"]
    real.delete(TELEMETRY_STREAM)


def test_a_rank_carried_in_place_is_resumed_under_each_rounds_own_key(tmp_path: Path) -> None:
    real = redis.Redis.from_url(redis_url())
    real.delete(TELEMETRY_STREAM)
    rank_dir = tmp_path / "job-8" / "round-1" / "rank-0"
    rank_dir.mkdir(parents=True)
    telemetry, stdout, stderr = rank_dir / "telemetry.jsonl", rank_dir / "stdout.log", rank_dir / "stderr.log"
    for path in (telemetry, stdout, stderr):
        path.touch()
    # Given a rank shipped as rank 0 of round 1, then carried into round 2 as rank 1 (in place)
    first = TelemetryShipper(redis_url(), "host-c", KEY)
    first.add(8, 1, 0, telemetry, stdout, stderr)
    write_lines(telemetry, [{"kind": "metric", "step": s, "values": {"loss": 1.0}} for s in (1, 2)])
    stdout.write_text("round one a\nround one b\n")
    first.tick()
    first.carry((8, 1, 0), (8, 2, 1))
    with stdout.open("a") as fh:
        fh.write("round two a\n")
    first.tick()
    # ... and the agent died before it read the rank's last lines
    write_lines(telemetry, [{"kind": "metric", "step": 3, "values": {"loss": 0.5}}])
    with stdout.open("a") as fh:
        fh.write("round two b\n")
    live = sent_records(real)
    real.delete(TELEMETRY_STREAM)

    # When an agent starts again on the same data directory
    second = TelemetryShipper(redis_url(), "host-c", KEY)
    assert second.resume_unshipped(tmp_path) == 1
    second.tick()

    # Then each part of the files goes again under the key it had live (ingest drops the
    # repeats), the unread lines under the round they were written in, nothing under both
    def keyed(sent: list[tuple[Any, dict[str, Any]]]) -> set[tuple[Any, ...]]:
        return {(key, r["kind"], r["seq"], r.get("text", r.get("step"))) for key, r in sent}

    resent = keyed(sent_records(real))
    assert keyed(live) < resent
    assert resent - keyed(live) == {((8, 2, 1), "log", 4, "round two b"), ((8, 2, 1), "metric", 3, 3)}
    assert {r[0] for r in resent if r[1] == "log" and str(r[3]).startswith("round one")} == {(8, 1, 0)}
    assert not (rank_dir / "shipping.json").exists()
    real.delete(TELEMETRY_STREAM)
