"""Where an audited change came from: the request's source address and how its caller signed in.

``AuditContextMiddleware`` keeps the current request in a context variable, so
``AuditEntry.record`` (called by actions deep below the views: submit, resize, drain...) fills in
the address and the auth method without every action passing the request down. Outside a request
(Celery tasks, management commands) an entry says ``system``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

_current_request: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar(
    "trainyard_audit_request", default=None
)


class AuthMethod:
    """How the caller of an audited change proved who they are."""

    SESSION = "session"  # the web console's sign-in cookie
    PASSWORD = "password"  # a sign-in itself (login form, admin, API login)
    TOKEN = "token"  # a personal API token
    NODE = "node"  # an agent's node credential
    SYSTEM = "system"  # no request: the controller, a task, a command


@dataclass(frozen=True)
class Origin:
    address: str
    auth_method: str
    token: str  # the token's prefix when a token was used


def client_address(request: HttpRequest) -> str:
    """The caller's address: the peer, or the entry TRUSTED_PROXY_COUNT hops back in
    X-Forwarded-For. Untrusted forwarding headers are ignored, so a client cannot pick the
    address its failed logins count against."""
    peer = str(request.META.get("REMOTE_ADDR") or "")
    hops: int = settings.TRUSTED_PROXY_COUNT
    if hops <= 0:
        return peer
    forwarded = [a.strip() for a in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",") if a.strip()]
    return forwarded[-hops] if len(forwarded) >= hops else peer


def mark_auth(request: HttpRequest, method: str, token_prefix: str = "") -> None:
    """Record on the request how its caller authenticated (called by the authentication classes)."""
    request.trainyard_auth_method = method  # type: ignore[attr-defined]
    request.trainyard_token_prefix = token_prefix  # type: ignore[attr-defined]


def current_origin() -> Origin:
    request = _current_request.get()
    if request is None:
        return Origin(address="", auth_method=AuthMethod.SYSTEM, token="")
    method = getattr(request, "trainyard_auth_method", None)
    if method is None:
        user = getattr(request, "user", None)
        method = AuthMethod.SESSION if getattr(user, "is_authenticated", False) else AuthMethod.PASSWORD
    return Origin(
        address=client_address(request),
        auth_method=method,
        token=getattr(request, "trainyard_token_prefix", ""),
    )


class AuditContextMiddleware:
    """Makes the request visible to AuditEntry.record for the duration of the request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        reset = _current_request.set(request)
        try:
            return self.get_response(request)
        finally:
            _current_request.reset(reset)


def current_request() -> HttpRequest | None:
    """The request being served in this context, if any."""
    return _current_request.get()


def with_request(request: HttpRequest) -> contextvars.Token[HttpRequest | None]:
    """For code that handles a request outside the middleware chain (signals given a request)."""
    return _current_request.set(request)
