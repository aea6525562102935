"""Bearer tokens on websockets: ``Authorization: Bearer ty_...`` on the handshake.

Browsers cannot set that header on a websocket, so a socket that carries it is a script's (the
CLI's ``metrics --follow``): it is authenticated by the token alone, with no session cookie and
no Origin check. Every other socket goes through the session (AuthMiddlewareStack) behind
AllowedHostsOriginValidator, as before: the Origin check guards the cookie, which a browser
sends by itself.

A token needs the ``read`` scope (``admin`` implies it). A refusal is decided here and carried in
the scope (``ws_refusal``: close code and reason); the consumer accepts and then closes with that
code, so the client sees it (a refusal before accepting reaches clients only as an HTTP 403):
4401 unknown, revoked or expired token, or a header that is not ``Bearer <token>``;
4403 the token lacks the ``read`` scope. A refused token is audited, as on the REST API; as
there, tokens are not subject to the sign-in lockout. (The close also carries a reason, but
Daphne sends only the code: clients go by the code.)
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends.db import SessionStore
from django.http import HttpRequest
from django.utils.crypto import constant_time_compare

from console.api.auth import find_token, record_refusal, token_refused
from console.api.models import ApiToken, Scope
from console.core.audit import _current_request, client_address, with_request

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403

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


Verdict = tuple[Any, tuple[int, str] | None, int | None]


def authenticate(header: str, scope: AsgiScope) -> Verdict:
    """(user, refusal, token id): the token's user and id, or AnonymousUser and the close code and
    reason."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() not in ("bearer", "token"):
        return AnonymousUser(), (CLOSE_UNAUTHORIZED, "Authorization header must be 'Bearer <token>'."), None
    raw = parts[1]
    request = handshake_request(scope)
    context = with_request(request)  # audit entries get the address (run in a worker thread)
    try:
        return check_token(raw, request)
    finally:
        _current_request.reset(context)


def check_token(raw: str, request: HttpRequest) -> Verdict:
    token, owner = find_token(raw)
    if token_refused(token):
        return AnonymousUser(), (CLOSE_UNAUTHORIZED, record_refusal(request, token, owner, raw)), None
    assert token is not None
    if not token.allows(Scope.READ):
        return AnonymousUser(), (CLOSE_FORBIDDEN, f"This token lacks the '{Scope.READ}' scope."), None
    token.note_use(client_address(request))
    return token.user, None, token.pk


def credential_still_valid(scope: AsgiScope) -> bool:
    """Whether an open socket's credential still holds: its token is not revoked or expired (and
    still reads), or its session still exists, for the same active user, with the same password
    (Django's session hash). Consumers ask this every WS_CREDENTIAL_RECHECK_SECONDS and close
    when it no longer does (console/telemetry/consumers.py)."""
    token_id = scope.get("api_token_id")
    if token_id is not None:
        token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
        return not token_refused(token) and token is not None and token.allows(Scope.READ)
    user = scope.get("user")
    key = getattr(scope.get("session"), "session_key", None)
    if not key or user is None or not user.is_authenticated:
        return False
    data = SessionStore(session_key=key).load()
    if str(data.get(SESSION_KEY, "")) != str(user.pk):
        return False
    fresh = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
    return fresh is not None and constant_time_compare(
        str(data.get(HASH_SESSION_KEY, "")), fresh.get_session_auth_hash()
    )


class BearerOrSession:
    """Websocket entry: a token on the handshake, else the session behind the Origin check."""

    def __init__(self, inner: Any) -> None:
        self.token_app = inner
        self.session_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope: AsgiScope, receive: Any, send: Any) -> Any:
        header = bearer_value(scope)
        if header is None:
            return await self.session_app(scope, receive, send)
        user, refusal, token_id = await database_sync_to_async(authenticate)(header, scope)
        scope = dict(scope, user=user, ws_refusal=refusal, auth_method="token", api_token_id=token_id)
        return await self.token_app(scope, receive, send)
