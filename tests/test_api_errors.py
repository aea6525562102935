"""Errors under /api/ are JSON in the one shape ({"detail", "errors"}): unknown paths, wrong
methods, unhandled exceptions; pages outside /api/ keep Django's HTML."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.jobs import api as jobs_api

pytestmark = pytest.mark.django_db


def signed_in(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def test_unknown_api_paths_are_json_404s(viewer: User) -> None:
    client = signed_in(viewer)
    for path in ("/api/v1/nope/", "/api/v2/jobs/", "/api/v1/jobs/1/nope/", "/api/"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json"
        assert path in response.json()["detail"]
    hint = client.get("/api/v1/jobs").json()["detail"]
    assert "Did you mean /api/v1/jobs/ ?" in hint
    assert Client().get("/api/v1/nope/").status_code == 401  # anonymous callers learn nothing


def test_wrong_methods_are_json_405s(operator: User) -> None:
    response = signed_in(operator).put("/api/v1/jobs/", "{}", content_type="application/json")
    assert response.status_code == 405 and response.json()["detail"] == 'Method "PUT" not allowed.'


def test_an_unhandled_exception_is_a_json_500(viewer: User, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(jobs_api.JobViewSet, "list", broken)  # fault injection: the handler is under test
    response = signed_in(viewer, raise_request_exception=False).get("/api/v1/jobs/")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert "Internal server error" in response.json()["detail"] and "a bug" not in response.content.decode()


def test_pages_keep_html_errors(viewer: User) -> None:
    response = signed_in(viewer).get("/no-such-page/")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")
