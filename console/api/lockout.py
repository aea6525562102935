"""Lockout after repeated failed sign-ins and enrolments, on top of django-axes.

Only what is tried without a credential is limited, and only per address: a password sign-in
(the login form, the admin, the API's password exchange, which all call ``authenticate``) and an
agent's enrolment with a join token. django-axes counts those failures per address, refuses a
locked-out address before the password is checked, and keeps the counts in the database, where
every web process sees them.

A valid API token or signed-in session is never refused because of failures: bearer tokens are
not checked against the lockout at all (a wrong one is a 401 and an audit entry; guessing a
256-bit token is hopeless), and failures that name an account do not lock that account (someone
else's wrong passwords would lock its owner's sign-in and CI tokens out).

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
    """Count per address only: failures naming an account must not lock that account's owner out."""
    return ["ip_address"]


def cooloff() -> timedelta:
    return timedelta(minutes=settings.LOGIN_COOLOFF_MINUTES)


def retry_after_seconds(request: HttpRequest) -> int:
    """Seconds until the newest counted failure of this address leaves the window."""
    match = Q(ip_address=client_address(request))
    latest = AccessAttempt.objects.filter(match).aggregate(latest=Max("attempt_time"))["latest"]
    if latest is None:
        return 1
    remaining = (latest + cooloff() - timezone.now()).total_seconds()
    return max(1, math.ceil(remaining))


def lockout_response(request: HttpRequest, *args: Any) -> HttpResponse:
    wait = retry_after_seconds(request)
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


def _recent_failures(request: HttpRequest) -> bool:
    """Whether this address failed within the window: one indexed query, so axes' own check (a
    sum over the attempts) runs only for an address that failed lately."""
    match = Q(ip_address=client_address(request))
    return AccessAttempt.objects.filter(match, attempt_time__gte=timezone.now() - cooloff()).exists()


def check_address_lockout(request: Any) -> None:
    """Raise 429 (with Retry-After) when this address is locked out: for what is tried without a
    credential other than a password (an enrolment's join token)."""
    raw = _axes_request(request)
    if not _recent_failures(raw):
        return
    if not AxesProxyHandler.is_allowed(raw, {}):
        wait = retry_after_seconds(raw)
        raise Throttled(
            wait=wait, detail=f"Too many failed attempts from this address. Try again in {wait} seconds."
        )


def address_failed(request: Any) -> None:
    """Count a failure (a wrong join token) against the address."""
    raw = _axes_request(request)
    user_login_failed.send(sender=__name__, credentials={"trainyard_enrolment": True}, request=raw)
