"""The jobs list: filters (state, owner, name prefix, created range), sort orders, cursor pages
that neither skip nor repeat a job, and a fixed number of queries whatever the page size."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from console.cluster.models import Node
from console.jobs.models import Allocation, Job, Round
from console.jobs.queries import filter_jobs

pytestmark = pytest.mark.django_db


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def running_job(name: str, owner: User, nodes: list[Node]) -> Job:
    job = Job.objects.create(
        name=name, owner=owner, workload="digits-mlp", state="RUNNING", round_number=2, max_nodes=len(nodes)
    )
    Round.objects.create(job=job, number=1, reason="start", world_size=1, master_addr="a", master_port=1)
    rnd = Round.objects.create(
        job=job, number=2, reason="resize", world_size=len(nodes) * 2, master_addr="a", master_port=2
    )
    for rank, node in enumerate(nodes):
        Allocation.objects.create(round=rnd, node=node, node_rank=rank, nproc=2)
    return job


def all_pages(client: APIClient, **params: Any) -> list[dict[str, Any]]:
    body = client.get("/api/v1/jobs/", params).json()
    results = list(body["results"])
    while body["next"]:
        body = client.get(body["next"]).json()
        results += body["results"]
    return results


def test_the_list_costs_the_same_queries_for_one_job_or_fifty(viewer: User, operator: User) -> None:
    nodes = [Node.objects.create(name=f"n{i}") for i in range(3)]
    running_job("first", operator, nodes)
    client = api(viewer)
    with CaptureQueriesContext(connection) as one:
        body = client.get("/api/v1/jobs/").json()
    assert body["results"][0]["nodes"] == ["n0", "n1", "n2"] and body["results"][0]["world_size"] == 6

    for i in range(49):
        running_job(f"j{i}", operator, nodes[: 1 + i % 3])
    with CaptureQueriesContext(connection) as fifty:
        body = client.get("/api/v1/jobs/").json()
    assert len(body["results"]) == 50
    assert len(fifty.captured_queries) == len(one.captured_queries), [
        q["sql"] for q in fifty.captured_queries
    ]
    by_name = {j["name"]: j for j in body["results"]}
    assert by_name["j4"]["nodes"] == ["n0", "n1"] and by_name["j4"]["world_size"] == 4


def test_filters_by_state_owner_name_prefix_and_created_range(viewer: User, operator: User) -> None:
    now = timezone.now()
    made = []
    for i, (name, state, owner) in enumerate(
        [
            ("bert-base", "RUNNING", operator),
            ("bert-large", "PENDING", viewer),
            ("gpt-small", "RUNNING", viewer),
            ("Bert-upper", "FAILED", operator),
        ]
    ):
        job = Job.objects.create(name=name, state=state, owner=owner, workload="digits-mlp")
        Job.objects.filter(pk=job.pk).update(created_at=now - timedelta(days=10 - i))
        made.append(job.pk)
    client = api(viewer)

    def names(**params: Any) -> list[str]:
        return sorted(j["name"] for j in all_pages(client, **params))

    assert names(state="RUNNING") == ["bert-base", "gpt-small"]
    assert names(state="running,pending") == ["bert-base", "bert-large", "gpt-small"]
    assert names(owner="olivia") == ["Bert-upper", "bert-base"]
    assert names(name="bert") == ["bert-base", "bert-large"]  # a prefix, case-sensitive
    assert names(name="bert", state="PENDING") == ["bert-large"]
    cut = (now - timedelta(days=8, hours=12)).isoformat()
    assert names(created_after=cut) == ["Bert-upper", "gpt-small"]
    assert names(created_before=cut) == ["bert-base", "bert-large"]

    bad = client.get("/api/v1/jobs/", {"state": "SLEEPING", "created_after": "yesterday", "sort": "owner"})
    assert bad.status_code == 400
    assert set(bad.json()["errors"]) == {"state", "created_after", "sort"}


@pytest.mark.parametrize(
    "sort", ["-created_at", "created_at", "name", "-name", "priority", "-priority", "id"]
)
def test_every_sort_pages_through_all_jobs_once_in_order(viewer: User, sort: str) -> None:
    # Repeated names and priorities: the cursor must keep its place among equal keys.
    for i in range(23):
        Job.objects.create(name=f"job-{i % 4}", priority=i % 3, workload="digits-mlp")
    client = api(viewer)
    seen = all_pages(client, sort=sort, page_size=5)
    assert len(seen) == 23 and len({j["id"] for j in seen}) == 23
    field = sort.lstrip("-")
    key = {"created_at": "created_at", "name": "name", "priority": "priority", "id": "id"}[field]
    values = [j[key] for j in seen]
    assert values == sorted(values, reverse=sort.startswith("-"))

    # previous links walk back the same pages.
    first = client.get("/api/v1/jobs/", {"sort": sort, "page_size": "5"}).json()
    second = client.get(first["next"]).json()
    back = client.get(second["previous"]).json()
    assert [j["id"] for j in back["results"]] == [j["id"] for j in first["results"]]


def test_bad_cursor_and_page_size_are_400(viewer: User) -> None:
    client = api(viewer)
    assert client.get("/api/v1/jobs/", {"cursor": "garbage"}).status_code == 400
    assert client.get("/api/v1/jobs/", {"page_size": 0}).status_code == 400
    assert client.get("/api/v1/jobs/", {"page_size": 501}).status_code == 400
    Job.objects.create(name="a", workload="digits-mlp")
    Job.objects.create(name="b", workload="digits-mlp")
    page = client.get("/api/v1/jobs/", {"page_size": "1", "sort": "name"}).json()
    # A cursor made for one sort order is refused by another.
    other = client.get(page["next"].replace("sort=name", "sort=-priority"))
    assert other.status_code == 400 and "cursor" in other.json()["errors"]


def test_the_web_pages_can_reuse_the_filter(viewer: User) -> None:
    Job.objects.create(name="keep-1", state="RUNNING", workload="digits-mlp")
    Job.objects.create(name="drop", state="RUNNING", workload="digits-mlp")
    found = filter_jobs({"name": "keep", "state": "running"})
    assert found.is_valid() and [j.name for j in found.qs] == ["keep-1"]
    invalid = filter_jobs({"state": "nope"})
    assert not invalid.is_valid() and "state" in invalid.errors


def test_rounds_endpoint_lists_every_round_newest_first(viewer: User, operator: User) -> None:
    job = running_job("r", operator, [Node.objects.create(name="n0")])
    body = api(viewer).get(f"/api/v1/jobs/{job.pk}/rounds/").json()
    assert [r["number"] for r in body["results"]] == [2, 1]
    assert body["results"][0]["allocations"][0]["node"] == "n0"
    assert api(viewer).get("/api/v1/jobs/999999/rounds/").status_code == 404
