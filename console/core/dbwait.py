"""Requests that ride out a short PostgreSQL outage (a restart, a fail-over) instead of failing.

A request that arrives while the database is unreachable waits for it, up to
``settings.DB_WAIT_SECONDS``, before its view runs; one whose view loses the database midway
(a restart while it runs) waits the same way and, if it only reads (GET, HEAD, OPTIONS), is run
again once. What still cannot reach the database answers 503 with Retry-After, never a 500: the
client is told to come back, and a write that failed was rolled back with its transaction.
PgBouncer in front of PostgreSQL does the same for every client of the database; this keeps the
console's own clients whole without one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import resolve

log = logging.getLogger(__name__)

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
RETRY_AFTER_SECONDS = 2
DATABASE_ERRORS = (OperationalError, InterfaceError)


def database_ready() -> bool:
    """True when the connection is open and answers; a broken connection is closed. The answer
    is Django's own health check (CONN_HEALTH_CHECKS: one ping per request, done here instead of
    at the first query), so a request costs no extra round trip."""
    try:
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        return True
    except DATABASE_ERRORS:
        connection.close()
        return False


def wait_for_database(seconds: float) -> bool:
    """Waits up to ``seconds`` for the database to answer; True once it does."""
    deadline = time.monotonic() + seconds
    pause = 0.1
    while not database_ready():
        if time.monotonic() + pause > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
    return True


def unavailable(request: HttpRequest) -> HttpResponse:
    text = "The console's database is unavailable; try again in a few seconds."
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": text}, status=503)
    else:
        response = HttpResponse(text, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseWaitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not database_ready() and not wait_for_database(settings.DB_WAIT_SECONDS):
            log.warning("database unavailable for %.0f s: 503 to %s", settings.DB_WAIT_SECONDS, request.path)
            return unavailable(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DATABASE_ERRORS):
            return None
        connection.close()  # a failed connection is useless, and a transaction on it is gone
        if not wait_for_database(settings.DB_WAIT_SECONDS):
            return unavailable(request)
        if request.method not in SAFE_METHODS:
            return unavailable(request)  # a write is not run twice; the client may send it again
        log.info("database came back; running %s %s again", request.method, request.path)
        match = resolve(request.path_info)
        try:
            response: HttpResponse = match.func(request, *match.args, **match.kwargs)
        except DATABASE_ERRORS:
            connection.close()
            return unavailable(request)
        if hasattr(response, "render") and callable(response.render):
            response = response.render()
        return response
