"""Repeated failed sign-ins and failed tokens lock out the address and the account: 429 with
Retry-After, on the login form, the API's password exchange and bearer tokens alike."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.api.models import ApiToken
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


def with_token(raw: str, address: str = "10.0.0.1") -> Any:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client.get("/api/v1/jobs/")


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
    # Another account from another address is not affected.
    User.objects.create_user("other", password="pw-other-1")
    assert form_login("other", "pw-other-1", address="10.0.0.2").status_code == 302


def test_an_account_is_locked_whatever_the_address(operator: User) -> None:
    for i in range(LIMIT):
        api_login("olivia", "wrong", address=f"10.1.0.{i}")
    wait = assert_locked(api_login("olivia", "pw-operator-1", address="10.9.9.9"))
    assert assert_locked(form_login("olivia", "pw-operator-1", address="10.9.9.8")) <= wait
    body = api_login("olivia", "pw-operator-1", address="10.9.9.9").json()
    assert "Too many failed sign-in attempts" in body["detail"]


def test_the_lock_lifts_when_the_cooloff_has_passed(operator: User) -> None:
    for _ in range(LIMIT):
        api_login("olivia", "wrong")
    assert_locked(api_login("olivia", "pw-operator-1"))
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert api_login("olivia", "pw-operator-1").status_code == 201


def test_wrong_tokens_lock_the_address_even_for_a_good_token(operator: User) -> None:
    _, good = ApiToken.issue(operator, "good", ["read"])
    for i in range(LIMIT - 1):
        assert with_token(f"ty_guess-{i}-0123456789abcdef").status_code == 401
    assert_locked(with_token("ty_guess-last-0123456789abcdef"))  # the failure that reaches the limit
    assert_locked(with_token(good))
    assert with_token(good, address="10.0.0.2").status_code == 200
    assert assert_locked(with_token("ty_another-guess")) > 0


def test_wrong_tokens_that_name_an_account_lock_that_account(operator: User) -> None:
    token, good = ApiToken.issue(operator, "good", ["read"])
    # Guesses that start like the account's token (its visible prefix) count against the account.
    for i in range(LIMIT - 1):
        assert with_token(token.prefix + f"guess{i}", address=f"10.2.0.{i}").status_code == 401
    assert_locked(with_token(token.prefix + "guess-last", address="10.2.0.9"))
    assert_locked(with_token(good, address="10.3.0.1"))
    # The revoked or expired token of an account is a failure of that account too.
    other = User.objects.create_user("other", password="pw-other-1")
    stale, stale_raw = ApiToken.issue(other, "stale", ["read"])
    stale.revoke()
    for i in range(LIMIT):
        with_token(stale_raw, address=f"10.4.0.{i}")
    assert AccessAttempt.objects.filter(username="other").exists()
