"""Lockout after repeated failed sign-ins and failed API tokens, on top of django-axes.

django-axes counts failures of Django's own sign-in (the login form, the admin, the API login,
which all call ``authenticate``) per address and per account, refuses a locked-out caller before
the password is checked, and keeps the counts in the database, where every web process sees them.
Failed bearer tokens are fed into the same counts (``token_failed``) and checked before a token
is accepted (``check_token_lockout``), so one limit covers passwords and tokens alike.

A locked-out caller gets 429 with ``Retry-After``: JSON under /api/ (and /metrics), a page
elsewhere.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db.models import Max, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from rest_framework.exceptions import Throttled

from console.core.audit import client_address


def lockout_parameters(request: Any, credentials: dict[str, Any] | None) -> list[str]:
    """Count per address always, and per account when the attempt names one. (Counting
    "no account" as one account would lock everyone out together.)"""
    if credentials and credentials.get("username"):
        return ["ip_address", "username"]
    return ["ip_address"]


def cooloff() -> timedelta:
    return timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES)


def retry_after_seconds(request: HttpRequest, username: str | None) -> int:
    """Seconds until the newest counted failure of this address or account leaves the window."""
    match = Q(ip_address=client_address(request))
    if username:
        match |= Q(username=username)
    latest = AccessAttempt.objects.filter(match).aggregate(latest=Max("attempt_time"))["latest"]
    if latest is None:
        return 1
    remaining = (latest + cooloff() - timezone.now()).total_seconds()
    return max(1, math.ceil(remaining))


def _credentials(args: tuple[Any, ...]) -> dict[str, Any] | None:
    # axes calls this with (request, response, credentials) or, on its async path, (request, credentials).
    for arg in reversed(args):
        if isinstance(arg, dict):
            return arg
    return None


def lockout_response(request: HttpRequest, *args: Any) -> HttpResponse:
    credentials = _credentials(args) or {}
    username = credentials.get("username")
    wait = retry_after_seconds(request, username)
    message = f"Too many failed sign-in attempts. Try again in {math.ceil(wait / 60)} minute(s)."
    response: HttpResponse
    if request.path.startswith(("/api/", "/metrics")):
        response = JsonResponse({"detail": message}, status=429)
    else:
        response = render(request, "api/locked_out.html", {"message": message}, status=429)
    response["Retry-After"] = str(wait)
    return response


def _axes_request(request: Any) -> HttpRequest:
    return getattr(request, "_request", request)


def _recent_failures(request: HttpRequest, username: str | None) -> bool:
    """Whether this address or account failed within the window: one indexed query. Nearly every
    token request has none, and axes' own check (a sum per address and per account) is skipped."""
    match = Q(ip_address=client_address(request))
    if username:
        match |= Q(username=username)
    return AccessAttempt.objects.filter(match, attempt_time__gte=timezone.now() - cooloff()).exists()


def check_token_lockout(request: Any, username: str | None) -> None:
    """Raise 429 (with Retry-After) when this address, or the account, is locked out."""
    raw = _axes_request(request)
    if not _recent_failures(raw, username):
        return
    credentials = {"username": username}
    if not AxesProxyHandler.is_allowed(raw, credentials):
        wait = retry_after_seconds(raw, username)
        raise Throttled(wait=wait, detail=f"Too many failed sign-in attempts. Try again in {wait} seconds.")


def token_failed(request: Any, username: str | None) -> None:
    """Count a failed bearer token against the address and, when known, the account."""
    raw = _axes_request(request)
    user_login_failed.send(
        sender=__name__, credentials={"username": username, "trainyard_token": True}, request=raw
    )
