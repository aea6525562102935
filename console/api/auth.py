"""Authentication of API callers: personal bearer tokens (``Authorization: Bearer ty_...``) with
their scopes, and the web console's session.

A token is refused when unknown, revoked or expired (401) and when the request needs a scope the
token lacks (403); ``admin`` implies every scope. A valid token is never refused because of other
requests' failures: tokens are not subject to the sign-in lockout (console/api/lockout.py), and a
refused token is audited (``auth.token_failed``), not counted against an address or account.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from console.api.models import PREFIX_LENGTH, ApiToken, Scope, hash_token
from console.core.audit import AuthMethod, client_address, mark_auth
from console.core.models import AuditEntry


def required_scope(request: Request, view: Any) -> str | None:
    """The scope a token needs for this request; None when any valid token will do.

    Views declare ``write_scope`` (for unsafe methods) or ``required_scope_for(request)``; reads
    need ``read``; an unsafe method on a view that declares nothing needs ``admin``, so a new
    endpoint is closed to narrow tokens until it says otherwise."""
    if view is not None and hasattr(view, "required_scope_for"):
        return view.required_scope_for(request)  # type: ignore[no-any-return]
    if request.method in permissions.SAFE_METHODS:
        return Scope.READ
    return getattr(view, "write_scope", Scope.ADMIN)


def find_token(raw: str) -> tuple[ApiToken | None, str | None]:
    """The token this raw value names (None when unknown) and the account it seems to be of
    (for the audit entry of a refusal)."""
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(raw)).first()
    return token, token.user.get_username() if token is not None else owner_by_prefix(raw)


def owner_by_prefix(raw: str) -> str | None:
    """A wrong token that starts like one of an account's tokens is audited under that account."""
    if len(raw) <= PREFIX_LENGTH:
        return None
    match = ApiToken.objects.filter(prefix=raw[:PREFIX_LENGTH]).select_related("user").first()
    return match.user.get_username() if match is not None else None


def token_refused(token: ApiToken | None) -> bool:
    return token is None or not token.usable or not token.user.is_active


def record_refusal(request: HttpRequest, token: ApiToken | None, owner: str | None, raw: str) -> str:
    """Audit a refused token; returns the message for the caller."""
    if token is None:
        reason = "unknown"
    elif token.revoked:
        reason = "revoked"
    elif token.expired:
        reason = "expired"
    else:
        reason = "inactive user"
    mark_auth(request, AuthMethod.TOKEN, token.prefix if token else raw[:PREFIX_LENGTH])
    AuditEntry.record_raw(
        token.user if token is not None else None,
        "auth.token_failed",
        target_type="apitoken",
        target_id=str(token.pk) if token is not None else "",
        actor_name=owner or "",
        reason=reason,
    )
    messages = {
        "revoked": "This API token was revoked.",
        "expired": "This API token has expired.",
    }
    return messages.get(reason, "Invalid API token.")


class TokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        raw = header[1].decode(errors="replace")
        token, owner = find_token(raw)
        if token_refused(token):
            self._refuse(request, token, owner, raw)
        assert token is not None
        mark_auth(request._request, AuthMethod.TOKEN, token.prefix)
        needed = required_scope(
            request, request.parser_context.get("view") if request.parser_context else None
        )
        if needed is not None and not token.allows(needed):
            raise exceptions.PermissionDenied(f"This token lacks the '{needed}' scope.")
        token.note_use(client_address(request._request))
        return token.user, token

    @staticmethod
    def _refuse(request: Request, token: ApiToken | None, owner: str | None, raw: str) -> None:
        raise exceptions.AuthenticationFailed(record_refusal(request._request, token, owner, raw))

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
