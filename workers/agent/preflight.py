"""The pre-flight network check on one host (protocol.AGENT_PREFLIGHT; DLRover runs one before
training): is every peer reachable on a port of the range rounds listen on, how fast, and can
this host reach the console and resolve names quickly?

Every host of a check does the same at once: it listens on its ``listen_port`` at its own
address (where a round's store would), probes each peer's listener (connect, retried until the
peer is up or the deadline passes; a few 1-byte round trips for the latency; ``bandwidth_bytes``
sent and acknowledged for the bandwidth), times an HTTP request to the console URL and the DNS
look-ups a round makes (the console's name forward; its own address reversed, as c10d's store
does for each client: 10 s per look-up where no DNS server answers), and answers with one
``PreflightResult``. Its listener closes once every peer has finished with it, so a check takes
about as long as its slowest host needs to start, not the deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import socket
import statistics
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from workers.protocol import PeerResult, PreflightPeer, PreflightRequest, PreflightResult

log = logging.getLogger(__name__)

PING = b"p"
BULK = b"b"
DONE = b"k"
LATENCY_SAMPLES = 5
CHUNK = 64 * 1024
DNS_LIMIT_SECONDS = 2.0  # a look-up slower than this is as bad as none (c10d waits 10 s)


class Listener(threading.Thread):
    """Answers peers' probes on one port until ``expected`` peers finished a bulk transfer or it
    is closed: a ping byte is echoed, a bulk transfer (8-byte length, then the bytes) acknowledged."""

    def __init__(self, address: str, port: int, expected: int) -> None:
        super().__init__(name=f"preflight-listen-{port}", daemon=True)
        self.sock = socket.create_server((address, port), reuse_port=False)
        self.sock.settimeout(0.2)
        self._expected = expected
        self._served = 0
        self._lock = threading.Lock()
        self.finished = threading.Event()
        if expected == 0:
            self.finished.set()

    def run(self) -> None:
        with self.sock:
            while not self.finished.is_set():
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10.0)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                kind = conn.recv(1)
                if kind == PING:
                    conn.sendall(PING)
                elif kind == BULK:
                    (size,) = struct.unpack("!Q", _read_exactly(conn, 8))
                    left = size
                    while left > 0:
                        got = conn.recv(min(CHUNK, left))
                        if not got:
                            return
                        left -= len(got)
                    conn.sendall(DONE)
                    with self._lock:
                        self._served += 1
                        if self._served >= self._expected:
                            self.finished.set()
                else:
                    return

    def close(self) -> None:
        self.finished.set()


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        got = conn.recv(size - len(data))
        if not got:
            raise ConnectionError("peer closed the connection")
        data += got
    return data


def probe_peer(peer: PreflightPeer, bandwidth_bytes: int, deadline: float) -> PeerResult:
    """Reach, latency and bandwidth to one peer's listener; connecting is retried until
    ``deadline`` (monotonic), as the peer may start listening a moment after this host."""
    last_error = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return PeerResult(
                node=peer["node"],
                ok=False,
                latency_ms=None,
                bandwidth_mbps=None,
                error=f"cannot connect to {peer['address']}:{peer['port']}: {last_error or 'timed out'}",
            )
        try:
            conn = socket.create_connection((peer["address"], peer["port"]), timeout=min(1.0, left))
            break
        except OSError as exc:
            last_error = str(exc) or type(exc).__name__
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    with conn:
        try:
            conn.settimeout(max(0.5, deadline - time.monotonic()))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            samples = []
            for _ in range(LATENCY_SAMPLES):
                began = time.perf_counter()
                conn.sendall(PING)
                if conn.recv(1) != PING:
                    raise ConnectionError("the peer's listener answered something else")
                samples.append((time.perf_counter() - began) * 1000)
            payload = b"\0" * CHUNK
            began = time.perf_counter()
            conn.sendall(BULK + struct.pack("!Q", bandwidth_bytes))
            left_bytes = bandwidth_bytes
            while left_bytes > 0:
                part = payload[: min(CHUNK, left_bytes)]
                conn.sendall(part)
                left_bytes -= len(part)
            if conn.recv(1) != DONE:
                raise ConnectionError("the peer did not acknowledge the transfer")
            took = max(1e-6, time.perf_counter() - began)
        except OSError as exc:
            return PeerResult(
                node=peer["node"],
                ok=False,
                latency_ms=None,
                bandwidth_mbps=None,
                error=f"connected to {peer['address']}:{peer['port']}, then: {exc or type(exc).__name__}",
            )
    return PeerResult(
        node=peer["node"],
        ok=True,
        latency_ms=round(statistics.median(samples), 3),
        bandwidth_mbps=round(bandwidth_bytes * 8 / took / 1e6, 1),
        error="",
    )


def _timed(call: Callable[[], object], limit: float) -> tuple[float | None, str]:
    """Runs ``call`` in a thread for at most ``limit`` seconds: (milliseconds, error)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    began = time.perf_counter()
    future = pool.submit(call)
    try:
        future.result(timeout=limit)
        return round((time.perf_counter() - began) * 1000, 3), ""
    except concurrent.futures.TimeoutError:
        return None, f"no answer within {limit:.0f} s"
    except OSError as exc:
        return round((time.perf_counter() - began) * 1000, 3), str(exc) or type(exc).__name__
    finally:
        pool.shutdown(wait=False)


def _reverse(address: str) -> None:
    with contextlib.suppress(socket.herror, socket.gaierror):
        socket.gethostbyaddr(address)


def check_console(url: str, timeout: float) -> tuple[bool, float | None, str]:
    """Any HTTP answer from the console's URL proves it reachable (a 404 is still the console)."""
    if not url:
        return False, None, "no console URL: the agent was not enrolled with --console"
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read(1)
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as exc:
        return False, None, f"{url}: {getattr(exc, 'reason', None) or exc}"
    return True, round((time.perf_counter() - began) * 1000, 3), ""


def run_check(request: PreflightRequest, address: str, console_url: str) -> PreflightResult:
    """One host's part of a pre-flight check (see the module's docstring)."""
    began = time.monotonic()
    deadline = began + max(0.5, float(request["deadline"]))
    peers = request["peers"]
    listener: Listener | None = None
    listen_error = ""
    try:
        listener = Listener(address, int(request["listen_port"]), expected=len(peers))
        listener.start()
    except OSError as exc:
        listen_error = f"cannot listen on {address}:{request['listen_port']}: {exc}"
    url = console_url or request["console_url"]
    host = urllib.parse.urlsplit(url).hostname or ""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(peers)))) as pool:
        probes = [pool.submit(probe_peer, p, int(request["bandwidth_bytes"]), deadline) for p in peers]
        console_ok, console_ms, console_error = check_console(url, timeout=min(5.0, deadline - began))
        dns_ms, dns_error = (None, "")
        if host:
            dns_ms, dns_error = _timed(lambda: socket.getaddrinfo(host, None), DNS_LIMIT_SECONDS)
        # No PTR record is the usual answer and costs nothing; only a look-up that hangs does.
        reverse_ms, reverse_error = _timed(lambda: _reverse(address), DNS_LIMIT_SECONDS)
        results = [probe.result() for probe in probes]
    if listener is not None:
        listener.finished.wait(max(0.0, deadline - time.monotonic()))
        listener.close()
    errors = [
        e
        for e in (
            dns_error and f"look-up of {host}: {dns_error}",
            reverse_error and f"reverse look-up of {address}: {reverse_error}",
        )
        if e
    ]
    return PreflightResult(
        listening=listener is not None,
        listen_error=listen_error,
        console_ok=console_ok,
        console_ms=console_ms,
        console_error=console_error,
        dns_ms=dns_ms,
        reverse_dns_ms=reverse_ms,
        dns_error="; ".join(errors),
        peers=results,
        seconds=round(time.monotonic() - began, 3),
    )
