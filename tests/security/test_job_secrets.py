"""A job's secrets: ``secret_env`` values are write-only, and viewers see no ``env`` values.

Attack: a viewer (or a read-only token, or anyone reading the admin, the audit log or a sweep)
reads the API keys an operator put in a job's environment. Before this, every viewer and
read-scope token got every job's ``env`` values from GET /api/v1/jobs/ and the job's page.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.api.models import ApiToken
from console.core.models import AuditEntry
from console.jobs import scheduler
from console.jobs.models import Job
from console.jobs.spec import round_spec
from tests.support.decisions import Decide, make_node
from workers.cli.errors import CliError
from workers.cli.submit import secrets_from_environment

pytestmark = pytest.mark.django_db

SECRET = "hf_write-only-7c1d9e"
PLAIN = "project-plain-42"
SPEC: dict[str, Any] = {
    "name": "with-secrets",
    "entrypoint": "/opt/train.py",
    "nnodes": "1",
    "env": {"WANDB_PROJECT": PLAIN},
    "secret_env": {"HF_TOKEN": SECRET},
}


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def submit(operator: User) -> dict[str, Any]:
    response = client_for(operator).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def test_viewers_and_read_tokens_see_env_names_and_nobody_sees_a_secret_value(
    operator: User, viewer: User, staff: User
) -> None:
    # Given an operator's job with a plain variable and a secret one
    body = submit(operator)
    job_id = body["id"]
    # Then the submitter sees the plain value and the secret's name, never its value
    assert body["env"] == {"WANDB_PROJECT": PLAIN}
    assert body["secret_env"] == ["HF_TOKEN"]
    assert SECRET not in str(body)

    # When a viewer reads the job, the list, and its rounds
    as_viewer = client_for(viewer)
    for url in (f"/api/v1/jobs/{job_id}/", "/api/v1/jobs/"):
        response = as_viewer.get(url)
        assert response.status_code == 200
        # Then it sees the names, and no value of either kind
        assert SECRET not in response.content.decode() and PLAIN not in response.content.decode(), url
    detail = as_viewer.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["env"] == {"WANDB_PROJECT": "(hidden)"} and detail["secret_env"] == ["HF_TOKEN"]

    # And the operator's own read-only token sees no values either; a jobs:write token does
    _, read_only = ApiToken.issue(operator, "ci-read", scopes=["read"])
    _, writer = ApiToken.issue(operator, "ci-write", scopes=["read", "jobs:write"])
    for raw, expected in ((read_only, "(hidden)"), (writer, PLAIN)):
        token_client = APIClient()
        token_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        got = token_client.get(f"/api/v1/jobs/{job_id}/")
        assert got.status_code == 200 and got.json()["env"]["WANDB_PROJECT"] == expected
        assert SECRET not in got.content.decode()

    # And staff see no secret value in the admin's job page or the audit log
    admin = Client()
    admin.force_login(staff)
    page = admin.get(f"/admin/jobs/job/{job_id}/change/")
    assert page.status_code == 200 and SECRET not in page.content.decode()
    assert AuditEntry.objects.filter(target_id=str(job_id)).exists()
    assert not [e for e in AuditEntry.objects.all() if SECRET in str(e.__dict__)]


def test_the_ranks_get_the_secret_in_their_environment(operator: User, decide: Decide) -> None:
    # Given the job placed on a node
    job = Job.objects.get(pk=submit(operator)["id"])
    make_node("gpu-a")
    decide(scheduler.tick)
    job.refresh_from_db()
    rnd = job.current_round()
    assert rnd is not None
    # Then the round spec its agent is sent carries both variables with their values
    (alloc,) = rnd.allocations.select_related("node")
    env = round_spec(job, rnd, alloc)["env"]
    assert env["HF_TOKEN"] == SECRET and env["WANDB_PROJECT"] == PLAIN


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"env": {"HF_TOKEN": "a"}, "secret_env": {"HF_TOKEN": "b"}}, "not both"),
        ({"secret_env": {"MASTER_ADDR": "evil"}}, "cannot be overridden"),
        ({"secret_env": {"1BAD": "x"}}, "not a valid"),
    ],
)
def test_bad_secret_env_is_refused_with_the_field_named(
    operator: User, change: dict[str, Any], fragment: str
) -> None:
    response = client_for(operator).post("/api/v1/jobs/", {**SPEC, **change}, format="json")
    assert response.status_code == 400
    assert fragment in str(response.json()["errors"]["secret_env"]), response.json()
    assert not Job.objects.exists()


def test_a_sweep_shows_its_secret_env_names_only(operator: User, viewer: User) -> None:
    job = {"name": "base", "workload": "digits-mlp", "secret_env": {"HF_TOKEN": SECRET}}
    body: dict[str, Any] = {"name": "s", "job": job, "objective": "test_loss", "direction": "minimize"}
    body.update(max_trials=2, space={"lr": {"type": "float", "low": 0.001, "high": 0.1}})
    created = client_for(operator).post("/api/v1/sweeps/", body, format="json")
    assert created.status_code == 201, created.content
    for user in (operator, viewer):
        got = client_for(user).get(f"/api/v1/sweeps/{created.json()['id']}/")
        assert got.status_code == 200
        assert SECRET not in got.content.decode() and got.json()["job"]["secret_env"] == ["HF_TOKEN"]


def test_the_cli_reads_secret_values_from_the_environment_never_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert secrets_from_environment(["HF_TOKEN"]) == {"HF_TOKEN": SECRET}
    with pytest.raises(CliError, match="name only"):
        secrets_from_environment([f"HF_TOKEN={SECRET}"])
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(CliError, match="not set"):
        secrets_from_environment(["HF_TOKEN"])
