"""Each pytest-xdist worker gets a Redis database and a TRAINYARD_HOME of its own.

``TEST_WORKERS=2 bin/test`` runs the suite on two workers (``-n 2``). What they would otherwise share:

* PostgreSQL: pytest-django already gives each worker its own test database
  (``test_trainyard_gw0``, ``test_trainyard_gw1``), and the processes a test starts are pointed
  at the database the test uses (tests/support/controller.py).
* Redis: tests flush their database (tests/support/cluster.py) and Celery, the channel layer and
  the telemetry streams live there, so worker N uses database ``base + N``.
* TRAINYARD_HOME: keys, bundles and the static root; worker N uses ``<home>-gwN``.

This has to run before Django reads its settings, which pytest-django does while the first
conftest files load, so it is a plugin given on the command line (``-p tests.support.xdist_env``,
imported while pytest parses its arguments), not a conftest hook. Outside xdist it does nothing.
"""

from __future__ import annotations

import os
import re


def worker_number() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def redis_url_for(url: str, number: int) -> str:
    """``url`` with its database number moved up by ``number`` (database 0 when it names none)."""
    match = re.fullmatch(r"(?P<base>redis(?:s)?://[^/]*)(?:/(?P<db>\d*))?(?P<query>\?.*)?", url)
    if match is None:
        raise ValueError(f"REDIS_URL {url!r} is not a redis:// URL")
    db = int(match["db"] or 0) + number
    if db > 15:
        raise ValueError(f"REDIS_URL {url!r}: worker {number} would need Redis database {db} (16 by default)")
    return f"{match['base']}/{db}{match['query'] or ''}"


def _isolate() -> None:
    number = worker_number()
    if number is None:
        return
    if url := os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = redis_url_for(url, number)
    if home := os.environ.get("TRAINYARD_HOME"):
        os.environ["TRAINYARD_HOME"] = f"{home.rstrip('/')}-gw{number}"


_isolate()
