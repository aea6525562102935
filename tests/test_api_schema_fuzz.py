"""Schemathesis against the live console: every operation of the schema the server itself serves,
called with generated input as an operator and as a viewer. No answer may be a 5xx, carry an
undocumented status or content type, or break its documented response schema.

Path ids are half the time replaced by ids of real objects, so success answers are checked too,
not only 404s. The examples are derandomized: a failure reproduces on the next run.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from console.api.models import ALL_SCOPES, ApiToken
from console.cluster.models import Node
from console.jobs.bundles import store_bundle
from console.jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_OPERATION = 8
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def no_lockout(monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path) -> None:
    """Generated passwords fail by the hundred from one address; lockout has its own tests. The
    console process reads these from its environment."""
    monkeypatch.setenv("TRAINYARD_LOGIN_FAILURE_LIMIT", "1000000")
    bundles = tmp_path / "bundles"
    monkeypatch.setenv("TRAINYARD_BUNDLE_ROOT", str(bundles))
    settings.BUNDLE_ROOT = bundles


def archive() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    return data.getvalue()


class Caller:
    """A user's bearer token, minted again when a generated call revokes it (DELETE current/)."""

    def __init__(self, user: User) -> None:
        self.user = user
        self.token, self.raw = ApiToken.issue(user, "fuzz", ALL_SCOPES)

    def headers(self) -> dict[str, str]:
        if not ApiToken.objects.filter(pk=self.token.pk, revoked=False).exists():
            self.token, self.raw = ApiToken.issue(self.user, "fuzz", ALL_SCOPES, replace=True)
        return {"Authorization": f"Bearer {self.raw}"}


def twisted_refused_multipart(media_type: str | None, response: requests.Response) -> bool:
    """Daphne's HTTP layer (Twisted) parses multipart bodies itself and answers a bare 400, before
    the console sees the request, for one it cannot parse (twisted/twisted#9739, django/daphne#447).
    That answer is the server's, not the API's (any endpoint that takes a body documents
    multipart, DRF's default parsers); anything else is checked."""
    multipart = (media_type or "").startswith("multipart/")
    return multipart and response.status_code == 400 and not response.content


def real_ids(operator: User) -> Callable[[str, str], Any]:
    job = Job.objects.create(name="fuzz", owner=operator, workload="digits-mlp", max_nodes=2, desired_nodes=2)
    node = Node.objects.create(name="fuzz-node", state="ONLINE")
    bundle = store_bundle(SimpleUploadedFile("b.tar.gz", archive()), operator)
    probe, _ = ApiToken.issue(operator, "probe", ["read"])
    by_prefix = {"/api/v1/jobs/": job.pk, "/api/v1/nodes/": node.pk, "/api/v1/bundles/": bundle.pk}

    def real(path: str, name: str) -> Any:
        if name == "job_id":
            return job.pk
        if name == "sha256":
            return bundle.sha256
        if path.startswith("/api/v1/tokens/"):
            return probe.pk
        return next((v for prefix, v in by_prefix.items() if path.startswith(prefix)), None)

    return real


def test_every_operation_as_operator_and_viewer(
    no_lockout: None, console_url: str, operator: User, viewer: User
) -> None:
    real = real_ids(operator)
    callers = {"operator": Caller(operator), "viewer": Caller(viewer)}
    loaded = requests.get(
        f"{console_url}/api/schema/?format=json", headers=callers["viewer"].headers(), timeout=60
    )
    assert loaded.status_code == 200
    schema = schemathesis.openapi.from_dict(loaded.json())
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 30, [op.label for op in operations]
    session = requests.Session()
    tried: dict[str, set[int]] = {}

    def run(operation: Any, role: str, caller: Caller) -> None:
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(), use_real=st.booleans())
        def call(case: Any, use_real: bool) -> None:
            if use_real:
                for name in list(case.path_parameters or {}):
                    value = real(operation.path, name)
                    if value is not None:
                        case.path_parameters[name] = value
            if operation.path.endswith("/logs/stream/"):
                case.query = {**(case.query or {}), "timeout": 1}  # a stream otherwise lasts an hour
            response = case.call(base_url=console_url, session=session, headers=caller.headers(), timeout=60)
            tried.setdefault(f"{role} {operation.label}", set()).add(response.status_code)
            if twisted_refused_multipart(case.media_type, response):
                return
            case.validate_response(response, checks=CHECKS)

        call()

    for operation in operations:
        for role, caller in callers.items():
            run(operation, role, caller)

    # The run reached real objects, not only 404s: successes were checked against their schemas.
    assert {200} <= tried["viewer GET /api/v1/jobs/{id}/"]
    assert {201} <= tried["operator POST /api/v1/jobs/"] | tried["operator POST /api/v1/tokens/"]
    assert 403 in tried["viewer POST /api/v1/jobs/"]
    assert all(code < 500 for codes in tried.values() for code in codes)
