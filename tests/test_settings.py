"""A malformed setting stops start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
START = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"


def start(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG",)}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", TRAINYARD_HOME=str(tmp_path))
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "-c", START], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "DATABASE_URL",
            "mysql://x",
            "DATABASE_URL='mysql://x': only postgres:// URLs are supported",
        ),
        (
            "DATABASE_URL",
            "sqlite:///console.sqlite3",
            "SQLite is not supported. Unset DATABASE_URL to use the embedded PostgreSQL that bin/run "
            "starts under TRAINYARD_HOME, or give postgres://",
        ),
        (
            "DATABASE_URL",
            "postgres://u@h:notaport/db",
            "DATABASE_URL='postgres://u@h:notaport/db' has a malformed port",
        ),
        ("DATABASE_URL", "postgres://u@h:5432/", "names no database"),
        ("REDIS_URL", "http://x", "REDIS_URL='http://x': expected redis://host:port/db"),
        ("REDIS_URL", "redis://h:6379/zero", "the database must be a number"),
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("TRAINYARD_HEARTBEAT_MISSES", "0", "TRAINYARD_HEARTBEAT_MISSES=0 must be at least 1"),
    ],
)
def test_malformed_setting_fails_start_up_clearly(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    result = start(tmp_path, **{name: value})
    assert result.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_well_formed_settings_start(tmp_path: Path) -> None:
    result = start(
        tmp_path,
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/anything",
        REDIS_URL="redis://127.0.0.1:6379/3",
        DEBUG="off",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.postgresql"


def test_unset_urls_mean_the_embedded_servers_on_ports_kept_in_trainyard_home(tmp_path: Path) -> None:
    # Given no DATABASE_URL and no REDIS_URL
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", TRAINYARD_HOME=str(tmp_path))
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "db = settings.DATABASES['default']; "
        "print(db['ENGINE'], db['HOST'], db['PORT'], db['NAME'], db['USER'], settings.REDIS_URL)"
    )

    def start() -> list[str]:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    # When settings load, twice (two starts of the console)
    first, second = start(), start()

    # Then both point at the embedded PostgreSQL and Redis, on the ports saved under TRAINYARD_HOME
    pg_port = (tmp_path / "postgres" / "port").read_text().strip()
    redis_port = (tmp_path / "redis" / "port").read_text().strip()
    redis_password = (tmp_path / "redis" / "password").read_text().strip()
    assert redis_password
    assert first == [
        "django.db.backends.postgresql",
        "127.0.0.1",
        pg_port,
        "trainyard",
        "postgres",
        f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
    ]
    assert second == first
    assert pg_port != redis_port
    assert (tmp_path / "postgres" / "password").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "redis" / "password").stat().st_mode & 0o777 == 0o600


def test_secret_key_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    result = start(tmp_path, SECRET_KEY="", SECRET_KEY_FILE=str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "SECRET_KEY_FILE=" in result.stderr and "cannot be read" in result.stderr
