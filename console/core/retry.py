"""The base class of every controller task: retried with backoff on transient errors.

A controller task that hits a lost database connection, a serialization failure or a deadlock,
or a broker that is away for a moment, is tried again (1, 2, 4 ... 30 s apart, with jitter)
instead of being dropped with the decision it carried. Every task is safe to run again: each
decision is one transaction (nothing is half-applied) and every report handler is idempotent.
"""

from __future__ import annotations

from typing import Any

import kombu.exceptions
import psycopg
import redis.exceptions
from celery import Task
from django.db import InterfaceError, OperationalError, connections

# Django wraps psycopg's errors (SerializationFailure and DeadlockDetected are OperationalErrors);
# psycopg's own classes cover errors raised outside Django's wrapper.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
)


class ControllerTask(Task):  # type: ignore[misc]
    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 1
    retry_backoff_max = 30
    retry_jitter = True
    max_retries = 10

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        # A connection the error broke must not be reused by the next attempt on this thread.
        for connection in connections.all(initialized_only=True):
            connection.close_if_unusable_or_obsolete()
