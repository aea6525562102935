"""Repeated failed sign-ins lock out the address they come from: 429 with Retry-After, on the
login form and the API's password exchange alike. Only sign-in (and enrolment) is limited: API
tokens are not, and failures naming an account do not lock that account. The attacks that
lockout must not enable are in tests/security/test_lockout_hits_only_the_failing_credential.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.core.models import AuditEntry

pytestmark = pytest.mark.django_db

LIMIT = 3


@pytest.fixture(autouse=True)
def small_limit(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_FAILURE_LIMIT = LIMIT


def form_login(username: str, password: str, address: str = "10.0.0.1") -> Any:
    return Client(REMOTE_ADDR=address).post("/accounts/login/", {"username": username, "password": password})


def api_login(username: str, password: str, address: str = "10.0.0.1") -> Any:
    body = {"username": username, "password": password, "name": "cli"}
    return APIClient(REMOTE_ADDR=address).post("/api/v1/auth/token/", body, format="json")


def assert_locked(response: Any) -> int:
    assert response.status_code == 429, response.content[:300]
    wait = int(response["Retry-After"])
    assert 0 < wait <= 15 * 60
    return wait


def test_the_login_form_locks_the_address_then_the_right_password_waits(operator: User) -> None:
    for _ in range(LIMIT - 1):
        assert form_login("olivia", "wrong").status_code == 200  # the form again, with its error
    assert_locked(form_login("olivia", "wrong"))
    locked = form_login("olivia", "pw-operator-1")
    assert_locked(locked)
    assert b"Too many failed sign-in attempts" in locked.content
    assert AuditEntry.objects.filter(action="auth.login_failed", actor_name="olivia").count() >= LIMIT
    assert AuditEntry.objects.filter(action="auth.locked_out").exists()
    # The same account from another address is not affected.
    assert form_login("olivia", "pw-operator-1", address="10.0.0.2").status_code == 302


def test_the_api_password_exchange_locks_the_address_too(operator: User) -> None:
    for _ in range(LIMIT):
        api_login("olivia", "wrong")
    wait = assert_locked(api_login("olivia", "pw-operator-1"))
    assert assert_locked(form_login("olivia", "pw-operator-1")) <= wait
    assert "Too many failed sign-in attempts" in api_login("olivia", "pw-operator-1").json()["detail"]
    assert api_login("olivia", "pw-operator-1", address="10.9.9.9").status_code == 201


def test_the_lock_lifts_when_the_cooloff_has_passed(operator: User) -> None:
    for _ in range(LIMIT):
        api_login("olivia", "wrong")
    assert_locked(api_login("olivia", "pw-operator-1"))
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert api_login("olivia", "pw-operator-1").status_code == 201
