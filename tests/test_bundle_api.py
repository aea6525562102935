"""Bundles through the REST API: upload, dedupe, list, download by agents; hostile uploads refused."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from console.api.models import ApiToken
from console.jobs.models import Bundle
from tests.test_bundle_extract import (
    absolute_path_tar,
    dotdot_tar,
    dotdot_zip,
    escaping_symlink_tar,
    good_tar,
    good_zip,
    make_tar,
    zip_bomb,
)

NODE_TOKEN = "node-secret-for-tests-0123456789"
LIMIT = 1024 * 1024


@pytest.fixture
def storage(settings: Any, tmp_path: Path) -> Path:
    root = tmp_path / "store" / "bundles"
    settings.BUNDLE_ROOT = root
    settings.BUNDLE_MAX_BYTES = LIMIT
    settings.NODE_TOKEN = NODE_TOKEN
    return root


def _client(user: User | None = None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def _upload(client: APIClient, path: Path, name: str | None = None) -> Any:
    upload = SimpleUploadedFile(name or path.name, path.read_bytes(), content_type="application/octet-stream")
    return client.post("/api/v1/bundles/", {"file": upload}, format="multipart")


def _stored_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_operator_uploads_dedupes_and_agents_download(
    storage: Path, tmp_path: Path, operator: User, viewer: User
) -> None:
    archive = good_tar(tmp_path / "project.tgz")
    content = archive.read_bytes()
    sha = hashlib.sha256(content).hexdigest()

    first = _upload(_client(operator), archive)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["sha256"] == sha and body["size_bytes"] == len(content) and body["filename"] == "project.tgz"
    assert (storage / sha[:2] / sha).read_bytes() == content

    again = _upload(_client(operator), archive, name="renamed.tgz")
    assert again.status_code == 201 and again.json()["id"] == body["id"]
    assert Bundle.objects.count() == 1
    assert _stored_files(storage) == [storage / sha[:2] / sha]

    listing = _client(viewer).get("/api/v1/bundles/")
    assert listing.status_code == 200
    assert [b["sha256"] for b in listing.json()["results"]] == [sha]
    assert _client(viewer).get(f"/api/v1/bundles/{body['id']}/").json()["sha256"] == sha

    url = f"/api/v1/bundles/{sha}/archive/"
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {NODE_TOKEN}")
    download = agent.get(url)
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == content  # type: ignore[attr-defined]
    assert download["X-Bundle-Sha256"] == sha

    signed_in = _client(operator).get(url)
    assert signed_in.status_code == 200
    assert b"".join(signed_in.streaming_content) == content  # type: ignore[attr-defined]
    _, raw = ApiToken.issue(operator, "cli")
    with_api_token = APIClient()
    with_api_token.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert with_api_token.get(url).status_code == 200
    # A viewer sees the bundle's metadata (above) but not its code, by session or token
    refused = _client(viewer).get(url)
    assert refused.status_code == 403 and "editors" in refused.json()["detail"]
    _, viewers_raw = ApiToken.issue(viewer, "cli")
    viewers_token = APIClient()
    viewers_token.credentials(HTTP_AUTHORIZATION=f"Bearer {viewers_raw}")
    assert viewers_token.get(url).status_code == 403

    assert APIClient().get(url).status_code == 401
    impostor = APIClient()
    impostor.credentials(HTTP_AUTHORIZATION="Bearer node-secret-for-tests-wrong")
    assert impostor.get(url).status_code == 401
    missing = agent.get(f"/api/v1/bundles/{'0' * 64}/archive/")
    assert missing.status_code == 404


def test_zip_bundle_is_accepted(storage: Path, tmp_path: Path, staff: User) -> None:
    response = _upload(_client(staff), good_zip(tmp_path / "code.zip"))
    assert response.status_code == 201, response.content
    assert Bundle.objects.get().filename == "code.zip"


def test_only_operators_may_upload(storage: Path, tmp_path: Path, viewer: User) -> None:
    archive = good_tar(tmp_path / "project.tgz")
    assert _upload(_client(viewer), archive).status_code == 403
    assert _upload(_client(), archive).status_code in (401, 403)
    assert _client().get("/api/v1/bundles/").status_code in (401, 403)
    assert Bundle.objects.count() == 0 and _stored_files(storage) == []


@pytest.mark.parametrize(
    ("builder", "message"),
    [
        (absolute_path_tar, "absolute path"),
        (dotdot_tar, "'..'"),
        (dotdot_zip, "'..'"),
        (escaping_symlink_tar, "outside the bundle"),
        (zip_bomb, "archive bomb"),
    ],
)
def test_hostile_bundles_are_refused_and_nothing_is_kept(
    storage: Path, tmp_path: Path, operator: User, builder: Callable[[Path], Path], message: str
) -> None:
    archive = builder(tmp_path / "hostile.bin")
    storage.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    response = _upload(_client(operator), archive)
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert Bundle.objects.count() == 0
    assert _stored_files(storage) == []
    # Only the (now empty) upload staging directory may have appeared, inside the store.
    assert {p for p in tmp_path.rglob("*") if p not in before} <= {storage / "incoming"}
    assert not Path("/tmp/trainyard-evil-absolute.txt").exists()


def test_oversize_and_missing_file_get_clear_errors(storage: Path, tmp_path: Path, operator: User) -> None:
    big = make_tar(tmp_path / "big.tar", [("noise.bin", os.urandom(LIMIT + 1000), {})], mode="w")
    response = _upload(_client(operator), big)
    assert response.status_code == 400
    assert "larger than the limit of 1 MB" in response.json()["detail"]
    empty = _client(operator).post("/api/v1/bundles/", {}, format="multipart")
    assert empty.status_code == 400
    assert "multipart field 'file'" in empty.json()["detail"]
    assert _stored_files(storage) == []
