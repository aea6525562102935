"""Bearer tokens on websockets: ``Authorization: Bearer ty_...`` on the handshake.

Browsers cannot set that header on a websocket, so a socket that carries it is a script's (the
CLI's ``metrics --follow``): it is authenticated by the token alone, with no session cookie and
no Origin check. Every other socket goes through the session (AuthMiddlewareStack) behind
AllowedHostsOriginValidator, as before: the Origin check guards the cookie, which a browser
sends by itself.

A token needs the ``read`` scope. A refusal is decided here and carried in the scope
(``ws_refusal``: close code and reason); the consumer accepts and then closes with that code, so
the client sees it (a refusal before accepting reaches clients only as an HTTP 403):
4401 unknown, revoked or expired token, or a header that is not ``Bearer <token>``;
4403 the token lacks the ``read`` scope; 4429 the address or account is locked out after
repeated failures. A refused token counts as a failed attempt, as on the REST API. (The close
also carries a reason, but Daphne sends only the code: clients go by the code.)
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from rest_framework.exceptions import Throttled

from console.api import lockout
from console.api.auth import find_token, record_refusal, token_refused
from console.api.models import Scope
from console.core.audit import _current_request, client_address, with_request

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_LOCKED_OUT = 4429

AsgiScope = dict[str, Any]


def bearer_value(scope: AsgiScope) -> str | None:
    """The Authorization header's value, or None when the handshake has none."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            return str(value.decode("latin-1"))
    return None


def handshake_request(scope: AsgiScope) -> HttpRequest:
    """A plain HttpRequest standing for the handshake, for what reads the caller's address and
    counts failures (django-axes, the audit log)."""
    request = HttpRequest()
    request.path = request.path_info = scope.get("path", "")
    request.method = "GET"
    client = scope.get("client") or ("", 0)
    request.META["REMOTE_ADDR"] = client[0]
    for name, value in scope.get("headers", []):
        key = name.decode("latin-1").upper().replace("-", "_")
        if key in ("USER_AGENT", "X_FORWARDED_FOR"):
            request.META[f"HTTP_{key}"] = value.decode("latin-1")
    return request


def authenticate(header: str, scope: AsgiScope) -> tuple[Any, tuple[int, str] | None]:
    """(user, refusal): the token's user, or AnonymousUser and the close code and reason."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() not in ("bearer", "token"):
        return AnonymousUser(), (CLOSE_UNAUTHORIZED, "Authorization header must be 'Bearer <token>'.")
    raw = parts[1]
    request = handshake_request(scope)
    context = with_request(request)  # audit entries get the address (run in a worker thread)
    try:
        return check_token(raw, request)
    finally:
        _current_request.reset(context)


def check_token(raw: str, request: HttpRequest) -> tuple[Any, tuple[int, str] | None]:
    token, owner = find_token(raw)
    try:
        lockout.check_token_lockout(request, owner)
    except Throttled as exc:
        return AnonymousUser(), (CLOSE_LOCKED_OUT, str(exc.detail))
    if token_refused(token):
        return AnonymousUser(), (CLOSE_UNAUTHORIZED, record_refusal(request, token, owner, raw))
    assert token is not None
    if not token.allows(Scope.READ):
        return AnonymousUser(), (CLOSE_FORBIDDEN, f"This token lacks the '{Scope.READ}' scope.")
    token.note_use(client_address(request))
    return token.user, None


class BearerOrSession:
    """Websocket entry: a token on the handshake, else the session behind the Origin check."""

    def __init__(self, inner: Any) -> None:
        self.token_app = inner
        self.session_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope: AsgiScope, receive: Any, send: Any) -> Any:
        header = bearer_value(scope)
        if header is None:
            return await self.session_app(scope, receive, send)
        user, refusal = await database_sync_to_async(authenticate)(header, scope)
        scope = dict(scope, user=user, ws_refusal=refusal, auth_method="token")
        return await self.token_app(scope, receive, send)
