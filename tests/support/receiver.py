"""A real HTTP webhook receiver on 127.0.0.1 for the alerts tests and bench/ops: it records every
request (arrival time, headers, body), answers with the next status of ``statuses`` (then 200),
and verifies Standard Webhooks signatures when given the channel's secret."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def verified(self, secret: str) -> Any:
        """The body, if its signature is the channel's; raises otherwise."""
        return Webhook(secret).verify(self.body, self.headers)


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with state.lock:
                state.received.append(
                    Received(time.time(), {k.lower(): v for k, v in self.headers.items()}, body)
                )
                status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
