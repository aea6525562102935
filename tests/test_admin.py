"""The inventory admin: open to staff, closed to everyone else; drain/undrain are audited."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from console.cluster.models import Gpu, Node
from console.core.models import AuditEntry
from console.core.states import NodeState
from console.jobs.models import Allocation, Bundle, Checkpoint, Job, Round
from console.telemetry.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def inventory(staff: User) -> dict[str, object]:
    node = Node.objects.create(name="gpu-a", hostname="gpu-a.lan", cpus=32)
    Gpu.objects.create(node=node, index=0, name="NVIDIA A100-SXM4-80GB")
    Gpu.objects.create(node=node, index=1, name="NVIDIA A100-SXM4-80GB")
    Node.objects.create(name="cpu-b", cpus=8)
    job = Job.objects.create(
        name="mnist", workload="mlp", owner=staff, min_nodes=1, max_nodes=2, desired_nodes=2
    )
    rnd = Round.objects.create(
        job=job, number=1, reason="start", world_size=2, master_addr="10.0.0.1", master_port=29500
    )
    Allocation.objects.create(round=rnd, node=node, node_rank=0, nproc=2, gpu_indices=[0, 1])
    Event.objects.create(job=job, kind="job.started", message="Round 1 started")
    Checkpoint.objects.create(job=job, round_number=1, step=100, path="/ckpt/100")
    Bundle.objects.create(sha256="a" * 64, size_bytes=10, filename="code.tar.gz", owner=staff)
    AuditEntry.objects.create(actor=staff, action="job.submit", target_type="job", target_id=str(job.pk))
    return {"node": node, "job": job, "round": rnd}


def admin_urls() -> list[str]:
    """Every registered model's changelist, plus a change page for each one that has a row."""
    urls = [reverse("admin:index")]
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            urls.append(reverse("admin:{}_{}_change".format(*info), args=[first.pk]))
    return urls


def test_staff_can_open_every_admin_page(client: Client, staff: User, inventory: dict[str, object]) -> None:
    client.force_login(staff)
    urls = admin_urls()
    assert len(urls) > 15
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url


def test_node_changelist_filters_by_state_and_gpu_model_and_searches(
    client: Client, staff: User, inventory: dict[str, object]
) -> None:
    client.force_login(staff)
    url = reverse("admin:cluster_node_changelist")
    assert {
        n.name for n in client.get(url, {"gpus__name": "NVIDIA A100-SXM4-80GB"}).context["cl"].result_list
    } == {"gpu-a"}
    assert {n.name for n in client.get(url, {"state": "ONLINE"}).context["cl"].result_list} == {
        "gpu-a",
        "cpu-b",
    }
    assert {n.name for n in client.get(url, {"q": "cpu"}).context["cl"].result_list} == {"cpu-b"}


def test_node_page_shows_its_gpus_inline(client: Client, staff: User, inventory: dict[str, object]) -> None:
    client.force_login(staff)
    node = inventory["node"]
    assert isinstance(node, Node)
    page = client.get(reverse("admin:cluster_node_change", args=[node.pk])).content.decode()
    assert page.count("NVIDIA A100-SXM4-80GB") >= 2


def test_job_page_keeps_controller_fields_read_only(
    client: Client, staff: User, inventory: dict[str, object]
) -> None:
    client.force_login(staff)
    job = inventory["job"]
    assert isinstance(job, Job)
    page = client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    for field in ("state", "round_number", "restarts", "min_nodes", "max_nodes", "desired_nodes"):
        assert f'name="{field}"' not in page, field
    assert 'name="name"' in page
    assert "Round 1 started" in page  # events inline
    assert "10.0.0.1" in page  # rounds inline


@pytest.mark.parametrize("who", ["operator", "viewer", "anonymous"])
def test_admin_refuses_non_staff(client: Client, request: pytest.FixtureRequest, who: str) -> None:
    request.getfixturevalue("inventory")
    if who != "anonymous":
        client.force_login(request.getfixturevalue(who))
    for url in admin_urls():
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("admin:login")), url


def test_drain_action_drains_the_node_and_writes_the_audit_log(
    client: Client, staff: User, inventory: dict[str, object]
) -> None:
    client.force_login(staff)
    node = inventory["node"]
    assert isinstance(node, Node)
    url = reverse("admin:cluster_node_changelist")

    response = client.post(url, {"action": "drain", "_selected_action": [node.pk]}, follow=True)

    assert response.status_code == 200
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING
    entry = AuditEntry.objects.get(action="node.drain")
    assert (entry.actor, entry.target_type, entry.target_id) == (staff, "node", str(node.pk))
    assert Event.objects.filter(kind="node.draining", node=node).count() == 1

    client.post(url, {"action": "undrain", "_selected_action": [node.pk]}, follow=True)

    node.refresh_from_db()
    assert node.state == NodeState.ONLINE
    assert AuditEntry.objects.filter(action="node.undrain", actor=staff, target_id=str(node.pk)).count() == 1


def test_drain_of_a_lost_node_is_reported_not_applied(client: Client, staff: User) -> None:
    client.force_login(staff)
    lost = Node.objects.create(name="gone", state=NodeState.LOST)
    response = client.post(
        reverse("admin:cluster_node_changelist"),
        {"action": "drain", "_selected_action": [lost.pk]},
        follow=True,
    )
    lost.refresh_from_db()
    assert lost.state == NodeState.LOST
    assert "cannot go from LOST to DRAINING" in response.content.decode()
    assert not AuditEntry.objects.filter(action="node.drain").exists()


def test_audit_log_cannot_be_edited_or_deleted(
    client: Client, staff: User, inventory: dict[str, object]
) -> None:
    client.force_login(staff)
    entry = AuditEntry.objects.first()
    assert entry is not None
    page = client.get(reverse("admin:core_auditentry_change", args=[entry.pk])).content.decode()
    assert 'name="action"' not in page
    assert client.get(reverse("admin:core_auditentry_delete", args=[entry.pk])).status_code == 403
    assert client.get(reverse("admin:core_auditentry_add")).status_code == 403
