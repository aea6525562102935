"""A job's live websocket (``/ws/jobs/<id>/``) for ``metrics --follow``, authenticated with the
CLI's API token (``Authorization: Bearer``; the console needs the ``read`` scope).

``follow_job`` yields the console's messages (``state``, ``metrics``, ``log``, ``event``...) as
dicts. It raises ``LiveUnavailable`` when the socket cannot be opened or the console closes it
(refused token 4401/4403/4429, no such job 4404, network trouble); callers fall back to polling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import connect

OPEN_TIMEOUT = 5.0
# How long to wait for a message before yielding None (so a live view can redraw its clock).
IDLE = 1.0

CLOSE_REASONS = {
    4401: "the console refused the token: unknown, revoked or expired",
    4403: "the token lacks the 'read' scope",
    4404: "no such job",
    4429: "too many failed attempts from here",
}


class LiveUnavailable(Exception):
    pass


def socket_url(console_url: str, job: int) -> str:
    url = httpx.URL(console_url)
    scheme = "wss" if url.scheme == "https" else "ws"
    return str(url.copy_with(scheme=scheme, path=url.path.rstrip("/") + f"/ws/jobs/{job}/"))


def follow_job(console_url: str, token: str, job: int) -> Iterator[dict[str, Any] | None]:
    """The job's messages as they come, None after IDLE seconds without one."""
    try:
        socket = connect(
            socket_url(console_url, job),
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=OPEN_TIMEOUT,
            max_size=16 * 1024 * 1024,
        )
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        raise LiveUnavailable(str(exc) or type(exc).__name__) from None
    with socket:
        while True:
            try:
                text = socket.recv(timeout=IDLE)
            except TimeoutError:
                yield None
                continue
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                reason = (exc.rcvd.reason if exc.rcvd is not None else "") or CLOSE_REASONS.get(code or 0, "")
                raise LiveUnavailable(
                    f"the console closed the socket ({code}: {reason or 'no reason'})"
                ) from None
            except OSError as exc:
                raise LiveUnavailable(str(exc) or type(exc).__name__) from None
            try:
                message = json.loads(text)
            except ValueError:
                continue
            if isinstance(message, dict):
                yield message
