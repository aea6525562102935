"""A PostgreSQL restart seen by the web process: requests wait for the database instead of
answering 500, and a request that cannot get it in time answers 503 with Retry-After.

The outage is real: new connections to the test database are refused (ALLOW_CONNECTIONS false)
and every open one is terminated, from a separate admin connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import override_settings

pytestmark = pytest.mark.django_db(transaction=True)


class Outage:
    def __init__(self) -> None:
        params = connection.get_connection_params()
        self.name = connection.settings_dict["NAME"]
        self.admin = psycopg.connect(
            host=params.get("host", "127.0.0.1"),
            port=params.get("port", 5432),
            user=params.get("user", "postgres"),
            dbname="postgres",
            autocommit=True,
        )

    def begin(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [self.name],
        )

    def end(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')


@pytest.fixture
def outage() -> Iterator[Outage]:
    down = Outage()
    try:
        yield down
    finally:
        down.end()
        down.admin.close()
        connection.close()


@pytest.fixture
def client() -> Client:
    user = User.objects.create_user("viewer", password="pw-viewer-1")
    browser = Client()
    browser.force_login(user)
    return browser


def test_a_request_during_a_short_outage_waits_and_succeeds(outage: Outage, client: Client) -> None:
    assert client.get("/api/v1/jobs/").status_code == 200
    outage.begin()
    threading.Timer(1.5, outage.end).start()

    started = time.monotonic()
    response = client.get("/api/v1/jobs/")

    assert response.status_code == 200, response.content
    assert time.monotonic() - started >= 1.0  # it waited for the database to come back


@override_settings(DB_WAIT_SECONDS=1.0)
def test_a_longer_outage_answers_503_with_retry_after(outage: Outage, client: Client) -> None:
    assert client.get("/api/v1/jobs/").status_code == 200
    outage.begin()

    api = client.get("/api/v1/jobs/")
    page = client.get("/jobs/")

    assert api.status_code == 503 and api["Retry-After"] == "2"
    assert "database is unavailable" in api.json()["detail"]
    assert page.status_code == 503 and page["Retry-After"] == "2"
