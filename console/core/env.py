"""Tiny typed helpers that read settings from the environment.

Every helper raises ``ImproperlyConfigured`` with the variable's name when the value is
malformed, so a typo fails at start-up instead of at the first request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envbool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def envint(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def envfloat(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def secret(name: str, fallback_file: Path) -> str:
    """A secret from NAME, from the file named by NAME_FILE, or else from a generated file.

    The generated file keeps sessions valid across restarts of a local console without
    asking the operator to invent a key.
    """
    if value := os.environ.get(name):
        return value
    if path := os.environ.get(f"{name}_FILE"):
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from None
    if fallback_file.exists():
        return fallback_file.read_text().strip()
    import secrets

    fallback_file.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(50)
    fallback_file.write_text(value)
    fallback_file.chmod(0o600)
    return value


def optional_secret(name: str) -> str:
    """A secret from NAME or from the file named by NAME_FILE; "" when neither is set."""
    if value := os.environ.get(name):
        return value
    if path := os.environ.get(f"{name}_FILE"):
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path!r} cannot be read: {exc}") from None
    return ""


def database_from_url(name: str, url: str) -> dict[str, Any]:
    """Django DATABASES entry for a postgres:// URL, the only engine Trainyard runs on."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # SQLite raised "database is locked" with the controller, ingest and web writing at
        # once, and a registration lost that way left a live node OFFLINE for good.
        raise ImproperlyConfigured(
            f"{name}={url!r}: SQLite is not supported. Unset {name} to use the embedded PostgreSQL "
            "that bin/run starts under TRAINYARD_HOME, or give postgres://user:password@host:5432/name."
        )
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ImproperlyConfigured(
            f"{name}={url!r}: only postgres:// URLs are supported (postgres://user:password@host:5432/name)"
        )
    db = unquote(parts.path.lstrip("/"))
    if not db:
        raise ImproperlyConfigured(f"{name}={url!r} names no database (postgres://user@host:port/NAME)")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={url!r} has a malformed port") from None
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": db,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


def redis_url(name: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"{name}={url!r}: expected redis://host:port/db")
    try:
        _ = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={url!r} has a malformed port") from None
    db = parts.path.lstrip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        raise ImproperlyConfigured(f"{name}={url!r}: the database must be a number")
    return url
