"""The job endpoints: submit, validation errors, roles, resize/restart/stop refusals."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.core.models import AuditEntry
from console.core.states import JobState
from console.jobs.models import Job
from console.telemetry.models import Event

pytestmark = pytest.mark.django_db

SPEC: dict[str, Any] = {
    "name": "ddp-mlp",
    "entrypoint": "/opt/train.py",
    "args": ["--steps", "100"],
    "nnodes": "2:3",
    "nproc_per_node": 2,
}


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def test_operator_submits_a_job_and_it_waits_pending(operator: User) -> None:
    response = client_for(operator).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "PENDING"
    assert (body["min_nodes"], body["max_nodes"], body["desired_nodes"]) == (2, 3, 3)
    assert body["round"] == 0 and body["world_size"] == 0 and body["nodes"] == [] and body["restarts"] == 0
    job = Job.objects.get(pk=body["id"])
    assert job.owner == operator
    assert AuditEntry.objects.filter(action="job.submit", target_id=str(job.pk)).count() == 1
    assert list(Event.objects.filter(job=job).values_list("kind", flat=True)) == ["job.submitted"]


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        ({"nnodes": "3:2"}, "nnodes", "larger than the maximum"),
        ({"nnodes": "two"}, "nnodes", "node count"),
        ({"nnodes": "0"}, "nnodes", "at least 1"),
        ({"nproc_per_node": 0}, "nproc_per_node", "greater than or equal to 1"),
        ({"workload": "digits-mlp"}, "workload", "not both"),
        ({"entrypoint": ""}, "workload", "either"),
        ({"env": {"MASTER_PORT": "1"}}, "env", "cannot be overridden"),
        ({"env": {"1BAD": "x"}}, "env", "not a valid"),
        ({"strategy": "gossip"}, "strategy", "valid choice"),
        ({"strategy": "parameter_server"}, "roles", "roles.ps is required"),
        ({"roles": {"ps": {"count": 1}, "worker": {"count": 1}}}, "roles", "parameter_server strategy"),
        ({"entrypoint": "train.py"}, "entrypoint", "needs a bundle or a workdir"),
        ({"bundle": 999999, "workdir": ""}, "bundle", "object does not exist"),
        ({"max_restarts": -1}, "max_restarts", "greater than or equal to 0"),
    ],
)
def test_invalid_specs_get_field_messages(
    operator: User, change: dict[str, Any], field: str, fragment: str
) -> None:
    response = client_for(operator).post("/api/v1/jobs/", {**SPEC, **change}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert fragment.lower() in " ".join(errors[field]).lower()
    assert Job.objects.count() == 0


def test_unknown_workload_is_named_in_the_error(operator: User) -> None:
    spec = {"name": "w", "workload": "no-such-workload", "nnodes": "1"}
    response = client_for(operator).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 400
    assert "no-such-workload" in " ".join(response.json()["errors"]["workload"])


def test_malformed_json_is_a_400_not_a_500(operator: User) -> None:
    response = client_for(operator).post("/api/v1/jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert "detail" in response.json()


def test_viewer_can_read_but_not_submit(viewer: User, operator: User) -> None:
    client_for(operator).post("/api/v1/jobs/", SPEC, format="json")
    assert len(client_for(viewer).get("/api/v1/jobs/").json()["results"]) == 1
    response = client_for(viewer).post("/api/v1/jobs/", SPEC, format="json")
    assert response.status_code == 403
    job = Job.objects.get()
    for verb in ("resize", "restart", "stop"):
        assert (
            client_for(viewer).post(f"/api/v1/jobs/{job.pk}/{verb}/", {"nodes": 2}, format="json").status_code
            == 403
        )
    assert Job.objects.get().state == JobState.PENDING


def test_anonymous_callers_are_refused() -> None:
    assert client_for(None).get("/api/v1/jobs/").status_code in (401, 403)
    assert client_for(None).post("/api/v1/jobs/", SPEC, format="json").status_code in (401, 403)


def test_resize_outside_the_range_is_refused_with_the_range(operator: User) -> None:
    job_id = client_for(operator).post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    response = client_for(operator).post(f"/api/v1/jobs/{job_id}/resize/", {"nodes": 4}, format="json")
    assert response.status_code == 400
    assert "2..3" in " ".join(response.json()["errors"]["nodes"])
    assert Job.objects.get(pk=job_id).desired_nodes == 3


def test_resize_of_a_pending_job_sets_its_target(operator: User) -> None:
    job_id = client_for(operator).post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    response = client_for(operator).post(f"/api/v1/jobs/{job_id}/resize/", {"nodes": 2}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["desired_nodes"] == 2
    assert AuditEntry.objects.filter(action="job.resize", target_id=str(job_id)).exists()


def test_stop_then_stop_again_is_a_conflict(operator: User) -> None:
    job_id = client_for(operator).post("/api/v1/jobs/", SPEC, format="json").json()["id"]
    first = client_for(operator).post(f"/api/v1/jobs/{job_id}/stop/")
    assert first.status_code == 200 and first.json()["state"] == "STOPPED"
    second = client_for(operator).post(f"/api/v1/jobs/{job_id}/stop/")
    assert second.status_code == 409
    assert "already STOPPED" in second.json()["detail"]
    restart = client_for(operator).post(f"/api/v1/jobs/{job_id}/restart/")
    assert restart.status_code == 409


def test_unknown_job_ids_are_404(operator: User) -> None:
    for url in ("/api/v1/jobs/424242/", "/api/v1/jobs/abc/"):
        assert client_for(operator).get(url).status_code == 404
    assert client_for(operator).post("/api/v1/jobs/424242/stop/").status_code == 404
    assert (
        client_for(operator).post("/api/v1/jobs/424242/resize/", {"nodes": 1}, format="json").status_code
        == 404
    )


def test_a_parameter_server_workloads_dataset_is_fixed_at_submission(operator: User) -> None:
    # Given a recsys-embedding PS job with 2 workers and the default examples (0: derived)
    spec = {
        "name": "ps",
        "workload": "recsys-embedding",
        "strategy": "parameter_server",
        "nnodes": "2",
        "roles": {"ps": {"count": 1}, "worker": {"count": 2, "max": 4}},
        "hyperparameters": {"steps": 100, "batch_size": 32},
    }
    response = client_for(operator).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    # then the examples per epoch are fixed now, from the workers asked for: a worker a resize
    # starts later declares the same dataset to the coordinator
    assert response.json()["hyperparameters"]["examples"] == 100 * 32 * 2
    given = {**spec, "hyperparameters": {"examples": 5000}}
    response = client_for(operator).post("/api/v1/jobs/", given, format="json")
    assert response.json()["hyperparameters"]["examples"] == 5000
