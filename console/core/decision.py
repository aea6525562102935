"""The controller's decision lock: one transaction at a time decides placement and rounds.

Decisions about placement and rounds (agents' reports, the periodic tick, the operator's resize,
restart and stop) run in ``decision()``, a transaction holding a PostgreSQL advisory lock until it
commits. Any number of controller threads or processes can run, die and restart without two of
them placing the same capacity or starting the same round twice. Submitting a job and draining
or undraining a node do not take the lock: they change one row under its row lock and ask for a
tick, which decides what follows in ``decision()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection, transaction

# Advisory lock key for "the controller is deciding" (any 64-bit number unique to us).
CONTROLLER_LOCK_KEY = 0x7472_6169_6E79


@contextlib.contextmanager
def decision() -> Iterator[None]:
    """A transaction holding the controller lock (serialises all placement decisions)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CONTROLLER_LOCK_KEY])
        yield
