"""What every bench shares: its own database and Redis, Django, a console's processes, and its
last line of JSON.

    from bench import harness

    def main(args) -> None:
        with harness.Bench("telemetry", database="ty_telemetry_bench", redis="private") as bench:
            url = bench.console.start_web()           # tests/support/services.py's Console
            bench.console.start_ingest("bench")
            ...                                       # measure
        harness.print_json(figures, KEYS)

    if __name__ == "__main__":
        harness.run(main, args)                       # SIGTERM/SIGINT unwind; nothing left running

``Bench`` creates the database (dropped again on the way out), starts a private redis-server
(or flushes the Redis db it is given), sets the environment every process of the bench gets,
sets Django up and migrates. On exit, however it exits, it stops the console's processes (the
agents first), Redis, and drops the database. Processes go through tests/support/procs.py: an
interrupted bench (Ctrl-C, SIGTERM) stops every one it started, and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support import procs  # noqa: E402
from tests.support.services import Console, RedisServer  # noqa: E402

PG_ADMIN_URL = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_url(name: str) -> str:
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def create_database(name: str) -> str:
    """A fresh database ``name`` on the shared PostgreSQL (one left by an earlier run is dropped)."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return database_url(name)


def drop_database(name: str) -> None:
    import psycopg

    with contextlib.suppress(ImportError):
        from django.db import connections

        connections.close_all()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Bench:
    """One bench run's database, Redis, environment and console (see the module docstring).

    ``redis``: ``"private"`` for a redis-server of the bench's own (append-only off), a
    ``redis://`` URL to use (flushed before and after), or None. ``env`` adds to the environment
    (this process's too: Django reads it). ``warm_pool`` is the agents' (None: the product's)."""

    def __init__(
        self,
        name: str,
        *,
        database: str | None = None,
        redis: str | None = "private",
        env: dict[str, str] | None = None,
        django: bool = True,
        warm_pool: int | None = None,
        root: Path | None = None,
        keep: bool = False,
    ) -> None:
        self.name = name
        self.database = database
        self.redis = redis
        self.extra_env = env or {}
        self.django = django
        self.warm_pool = warm_pool
        self.keep = keep or root is not None
        self.root = root or Path(tempfile.mkdtemp(prefix=f"trainyard-bench-{name}-"))
        self.redis_server: RedisServer | None = None
        self.redis_url = ""
        self.database_url = ""
        self.databases: list[str] = []
        self.consoles: dict[str, Console] = {}

    @property
    def console(self) -> Console:
        """The console's processes (created on first use, with the bench's environment)."""
        return self.console_of("console", self.env())

    def console_of(self, name: str, env: dict[str, str]) -> Console:
        """Another console (a second database, say), its logs under ``<root>/<name>``, stopped
        with the rest."""
        if name not in self.consoles:
            root = self.root if name == "console" else self.root / name
            self.consoles[name] = Console(root, env, warm_pool=self.warm_pool)
        return self.consoles[name]

    def add_database(self, name: str) -> str:
        """A fresh database ``name``, dropped on the way out; its URL."""
        url = create_database(name)
        self.databases.append(name)
        return url

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of every process the bench starts."""
        return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}

    def __enter__(self) -> Bench:
        procs.unwind_on_signals()
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise
        return self

    def _set_up(self) -> None:
        if self.redis == "private":
            self.redis_server = RedisServer(self.root / "redis", appendonly=False)
            self.redis_server.start()
            self.redis_url = self.redis_server.url
        elif self.redis:
            import redis

            self.redis_url = self.redis
            redis.Redis.from_url(self.redis_url).flushdb()
        if self.database:
            self.database_url = self.add_database(self.database)
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "console.settings",
                "TRAINYARD_HOME": str(self.root / "home"),
                "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
                **({"DATABASE_URL": self.database_url} if self.database_url else {}),
                **({"REDIS_URL": self.redis_url} if self.redis_url else {}),
                **self.extra_env,
            }
        )
        if self.django:
            import django
            from django.core.management import call_command

            django.setup()
            if self.database:
                call_command("migrate", verbosity=0)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops what the bench started (agents first), drops its database; idempotent. A second
        Ctrl-C or SIGTERM does not cut it short."""
        with procs.shielded():
            self._close()

    def _close(self) -> None:
        for console in reversed(self.consoles.values()):
            console.stop()
        if self.redis_server is not None:
            self.redis_server.stop()
        elif self.redis_url:
            import redis

            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(self.redis_url).flushdb()
        while self.databases:
            drop_database(self.databases.pop())
        if self.keep:
            print(f"logs kept in {self.root}", flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def run(main: Callable[..., Any], *args: Any) -> Any:
    """A bench's entry: SIGTERM and Ctrl-C unwind ``main`` like an exception; every process it
    started is stopped on the way out (interrupted: a one-line note and exit code 130)."""
    with procs.stopped_on_exit():
        return main(*args)


# --- figures -------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``th percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def print_json(figures: dict[str, Any], keys: Sequence[str] | None = None) -> None:
    """The bench's last line: ``figures`` (only ``keys``, in that order, when given) as JSON, a
    NaN (a figure that measured nothing) as null."""
    chosen = {k: figures.get(k) for k in keys} if keys is not None else figures
    print(
        json.dumps({k: None if isinstance(v, float) and v != v else v for k, v in chosen.items()}), flush=True
    )
