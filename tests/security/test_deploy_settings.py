"""Deployment behind TLS: with the environment docs/deploy.md gives (TRAINYARD_HTTPS=1 behind a
reverse proxy), ``manage.py check --deploy`` finds nothing, and the settings mean what they say:
secure cookies, HSTS, the forwarded protocol trusted. Without them it warns (so the check is
real). Agents warn before they send their secret over plain http to another host."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from workers.agent.credential import plain_http_warning, warn_if_plain_http

REPO = Path(__file__).resolve().parents[2]
DEPLOY_ENV = {
    "DEBUG": "0",
    "ALLOWED_HOSTS": "trainyard.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://trainyard.example.com",
    "TRAINYARD_HTTPS": "1",
    "TRAINYARD_HSTS_PRELOAD": "1",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, SECRET_KEY=secrets.token_urlsafe(50), **env)
    for name in ("TRAINYARD_HTTPS", "DEBUG"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_behind_tls() -> None:
    checked = manage("check", "--deploy", "--fail-level", "WARNING", **DEPLOY_ENV)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no issues" in checked.stdout
    shown = manage(
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings as s; print('SHOWN', s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER, s.SECURE_SSL_REDIRECT)",
        **DEPLOY_ENV,
    )
    assert shown.stdout.rsplit("SHOWN", 1)[-1].split() == [
        "True",
        "True",
        "31536000",
        "('HTTP_X_FORWARDED_PROTO',",
        "'https')",
        "True",
    ]


def test_check_deploy_warns_without_them() -> None:
    plain = {k: v for k, v in DEPLOY_ENV.items() if not k.startswith("TRAINYARD_")}
    checked = manage("check", "--deploy", "--fail-level", "WARNING", **plain)
    assert checked.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in checked.stdout + checked.stderr


def test_agents_warn_before_sending_their_secret_over_plain_http(caplog: pytest.LogCaptureFixture) -> None:
    assert plain_http_warning("http://console.example:8000/x") is not None
    assert plain_http_warning("http://10.0.0.5:8000/x") is not None
    for url in (
        "https://console.example/x",
        "http://127.0.0.1:8000/x",
        "http://localhost/x",
        "http://[::1]/",
    ):
        assert plain_http_warning(url) is None, url
    with caplog.at_level(logging.WARNING, "workers.agent.credential"):
        warn_if_plain_http("http://10.0.0.5:8000/api/v1/nodes/enroll/")
    assert "over plain http to 10.0.0.5" in caplog.text
