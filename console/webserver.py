"""The web server: Daphne, with request bodies bounded before they are spooled.

Daphne's HTTP layer (Twisted) reads a request's whole body into memory or a temporary file before
the console sees the request, and so before anyone is authenticated. Run through this module
(``python -m console.webserver`` takes Daphne's own arguments), each request's body is bounded
as it arrives:

- a ``Content-Length`` above ``REQUEST_BODY_MAX_BYTES`` (the bundle limit plus room for the
  multipart envelope) is answered 413 at once, before a byte of the body is read;
- a request that carries no credential (no ``Authorization`` header, no session cookie) may send
  at most ``ANONYMOUS_BODY_MAX_BYTES`` (sign-in, enrolment: small JSON or forms), by its
  ``Content-Length`` or, for a chunked body, by what has arrived;
- a request that carries one and announces (or streams) more than that is held, with the
  connection paused, until the credential is checked against the database: a valid API token or
  signed-in session gets the full limit; anything else the anonymous one.

A refusal is a JSON 413 and the connection is closed. Twisted's own parsing of form bodies is
off (Django parses them; Twisted answered a malformed multipart body with a bare 400), and the
errors Twisted and Daphne answer themselves are JSON under /api/.
"""

from __future__ import annotations

import asyncio
import json
import logging
import types
from http.cookies import SimpleCookie
from typing import Any

from channels.db import database_sync_to_async
from daphne import server as daphne_server  # first of Twisted: it installs the asyncio reactor
from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from django.conf import settings
from twisted.internet.defer import Deferred
from twisted.web import http

log = logging.getLogger(__name__)

# Chunks held in memory while a credential is being checked: the transport is paused at once,
# so at most the rest of one read (64 KiB) arrives meanwhile.
HELD_MAX_BYTES = 256 * 1024


def credential_is_valid(authorization: str, session_key: str) -> bool:
    """Whether the request's API token, or else its session, belongs to an active user.

    The full checks (scopes, lockout, CSRF) are the console's, once the request reaches it; this
    only decides how large a body may be spooled for it."""
    if authorization:
        from console.api.auth import find_token, token_refused

        parts = authorization.split()
        if len(parts) == 2 and parts[0].lower() in ("bearer", "token"):
            token, _ = find_token(parts[1])
            return not token_refused(token)
        return False
    if session_key:
        from django.contrib.auth import SESSION_KEY, get_user_model
        from django.contrib.sessions.backends.db import SessionStore

        user_id = SessionStore(session_key=session_key).load().get(SESSION_KEY)
        return user_id is not None and get_user_model().objects.filter(pk=user_id, is_active=True).exists()
    return False


def _json(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _bad_request_and_disconnect(channel: http.HTTPChannel) -> None:
    """Twisted's answer to a request it cannot parse, as JSON instead of an empty 400."""
    transport: Any = channel.transport
    transport.write(_json(400, "Bad Request", "Bad request: the server could not parse it."))
    channel.loseConnection()


class BoundedRequest(WebRequest):  # type: ignore[misc]
    """Daphne's request, with its body bounded as above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: int | None) -> None:
        self.body_seen = 0
        self.body_limit: int = settings.ANONYMOUS_BODY_MAX_BYTES
        self.held: list[bytes] | None = None  # chunks waiting for the credential check
        self.waiting_call: tuple[bytes, bytes, bytes] | None = None
        self.refused = False
        super().gotLength(length)
        hard: int = settings.REQUEST_BODY_MAX_BYTES
        if length is not None and length > hard:
            self.refuse(f"The request body ({length} bytes) is larger than the limit of {hard} bytes.")
            return
        if length is not None and length <= self.body_limit:
            return
        authorization = (self.requestHeaders.getRawHeaders(b"Authorization") or [b""])[0]
        session = self._session_key()
        if not authorization and not session:
            if length is not None:
                self.refuse_anonymous(length)
            return
        self.held = []
        self.channel._networkProducer.pauseProducing()
        future = asyncio.ensure_future(
            database_sync_to_async(credential_is_valid)(authorization.decode("latin-1"), session)
        )
        Deferred.fromFuture(future).addCallbacks(self.credential_checked, self.credential_check_failed)

    def _session_key(self) -> str:
        cookies = SimpleCookie()
        for raw in self.requestHeaders.getRawHeaders(b"Cookie") or []:
            try:
                cookies.load(raw.decode("latin-1"))
            except Exception:  # a malformed cookie header is no credential
                continue
        morsel = cookies.get(settings.SESSION_COOKIE_NAME)
        return morsel.value if morsel is not None else ""

    def credential_checked(self, valid: bool) -> None:
        held, self.held = self.held or [], None
        if self.refused:
            return
        if valid:
            self.body_limit = settings.REQUEST_BODY_MAX_BYTES
        for chunk in held:
            self.body_seen -= len(chunk)
            self.handleContentChunk(chunk)
            if self.refused:
                return
        if self.channel.transport is not None:
            self.channel._networkProducer.resumeProducing()
        if self.waiting_call is not None:
            super().requestReceived(*self.waiting_call)

    def credential_check_failed(self, failure: Any) -> None:
        log.error("checking a request's credential failed: %s", failure.getErrorMessage())
        self.credential_checked(False)

    def refuse_anonymous(self, size: int) -> None:
        self.refuse(
            f"A request body of {size} bytes needs a valid API token or session: without one, "
            f"at most {settings.ANONYMOUS_BODY_MAX_BYTES} bytes are accepted."
        )

    def refuse(self, detail: str) -> None:
        """413 with a JSON body, and the connection closed: the rest of the body is never read."""
        self.refused = True
        self.held = None
        self.content.close()
        transport = self.channel.transport
        if transport is not None:
            transport.write(_json(413, "Content Too Large", detail))
            self.channel.loseConnection()

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.body_seen += len(data)
        if self.held is not None:
            self.held.append(data)
            if self.body_seen > HELD_MAX_BYTES:
                self.refuse("The request body arrived faster than its credential could be checked.")
            return
        if self.body_seen > self.body_limit:
            if self.body_limit < settings.REQUEST_BODY_MAX_BYTES:
                self.refuse_anonymous(self.body_seen)
            else:
                self.refuse(f"The request body is larger than the limit of {self.body_limit} bytes.")
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self.refused:
            return
        if self.held is not None:  # the whole body came before the credential check ended
            self.waiting_call = (command, path, version)
            return
        super().requestReceived(command, path, version)

    def basic_error(self, status: int, status_text: bytes, body: str) -> None:
        """Daphne's own error answers (bad header, timeout, application crash): JSON under /api/."""
        if not (getattr(self, "path", b"") or b"").startswith(b"/api/"):
            super().basic_error(status, status_text, body)
            return
        self.handle_reply(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"Content-Type", b"application/json")],
            }
        )
        self.handle_reply({"type": "http.response.body", "body": json.dumps({"detail": body}).encode()})


class BoundedHTTPFactory(HTTPFactory):  # type: ignore[misc]
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        if protocol is not None:
            protocol.requestFactory = BoundedRequest
            protocol._respondToBadRequestAndDisconnect = types.MethodType(
                _bad_request_and_disconnect, protocol
            )
        return protocol


def main() -> None:
    daphne_server.HTTPFactory = BoundedHTTPFactory  # Server.run builds its factory from this name
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
