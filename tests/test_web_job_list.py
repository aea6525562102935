"""The jobs list page: filters (state, owner, name prefix), sortable columns, cursor pages that
neither skip nor repeat a job, a fixed number of queries per page, and (with EXPLAIN on a table
of 30,000 jobs) list queries that read an index, never the whole table."""

from __future__ import annotations

import html
import json
import re
from typing import Any
from urllib.parse import parse_qsl

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.jobs.models import Job, Round
from tests.support.jobs import copy_jobs

pytestmark = pytest.mark.django_db


def page_names(response: Any) -> list[str]:
    return [job.name for job in response.context["jobs"]]


def walk(client: Client, **params: str) -> list[str]:
    """Every job name, following the Next links from the first page."""
    response = client.get("/jobs/", params)
    names = page_names(response)
    while response.context["next_url"]:
        response = client.get("/jobs/" + html.unescape(response.context["next_url"]))
        names += page_names(response)
    return names


def test_every_page_costs_the_same_queries_whatever_the_list(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    job = Job.objects.create(name="only", workload="digits", owner=viewer, state="RUNNING", round_number=1)
    Round.objects.create(job=job, number=1, reason="start", world_size=4, master_addr="a", master_port=1)
    with CaptureQueriesContext(connection) as one:
        response = client.get("/jobs/", {"sort": "name"})
    assert page_names(response) == ["only"] and response.context["jobs"][0].world_size == 4

    for i in range(80):
        job = Job.objects.create(name=f"j-{i:03d}", workload="digits", owner=viewer, round_number=1)
        Round.objects.create(job=job, number=1, reason="start", world_size=2, master_addr="a", master_port=1)
    with CaptureQueriesContext(connection) as full:
        first = client.get("/jobs/", {"sort": "name", "owner": viewer.username})
    with CaptureQueriesContext(connection) as deeper:
        second = client.get("/jobs/" + html.unescape(first.context["next_url"]))
    assert len(page_names(first)) == len(page_names(second)) == 25
    assert len(one) == len(full) == len(deeper), [q["sql"] for q in deeper.captured_queries]


def test_filters_sorts_and_pages_forward_and_back(client: Client, viewer: User, operator: User) -> None:
    client.force_login(viewer)
    for i in range(60):
        Job.objects.create(
            name=f"{'bert' if i % 2 else 'gpt'}-{i:02d}",
            workload="digits",
            owner=operator if i % 3 == 0 else viewer,
            state="RUNNING" if i % 4 == 0 else "PENDING",
            priority=i % 5,
        )
    everything = walk(client, sort="name")
    assert everything == sorted(everything) and len(everything) == 60
    assert walk(client, sort="-name") == everything[::-1]
    assert walk(client) == [j.name for j in Job.objects.order_by("-created_at", "-id")]
    by_priority = walk(client, sort="-priority")
    assert by_priority == [j.name for j in Job.objects.order_by("-priority", "-created_at", "-id")]

    filtered = walk(client, name="bert", owner=operator.username, state="PENDING", sort="name")
    expected = Job.objects.filter(name__startswith="bert", owner=operator, state="PENDING").order_by("name")
    assert filtered == [j.name for j in expected] and filtered

    # The prefix is a prefix, not a pattern: "_" and "%" match only themselves.
    Job.objects.create(name="a_b", workload="digits")
    Job.objects.create(name="axb", workload="digits")
    Job.objects.create(name="a%c", workload="digits")
    assert walk(client, name="a_") == ["a_b"] and walk(client, name="a%") == ["a%c"]

    # Next then Previous comes back to the same page; the first page has no Previous.
    first = client.get("/jobs/", {"sort": "name"})
    assert first.context["previous_url"] == ""
    second = client.get("/jobs/" + html.unescape(first.context["next_url"]))
    back = client.get("/jobs/" + html.unescape(second.context["previous_url"]))
    assert page_names(back) == page_names(first)

    # The column header links flip the order and mark it for screen readers.
    body = first.content.decode()
    assert re.search(r'<th scope="col" aria-sort="ascending"><a class="sort-link" href="\?sort=-name"', body)


def test_bad_filters_and_stale_links_say_what_is_wrong(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    Job.objects.create(name="kept", workload="digits")
    bad = client.get("/jobs/", {"state": "SLEEPING", "name": "k"})
    assert bad.status_code == 200 and page_names(bad) == []
    body = bad.content.decode()
    assert "Unknown state(s) SLEEPING" in body and 'value="k"' in body  # what was typed stays
    assert "Select a valid choice" in client.get("/jobs/", {"sort": "colour"}).content.decode()

    first = client.get("/jobs/", {"sort": "name"})
    assert first.context["next_url"] == ""
    stale = client.get("/jobs/", {"sort": "-priority", "cursor": "not-a-cursor"})
    assert page_names(stale) == ["kept"]
    assert "That page link is out of date" in stale.content.decode()


def scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """The plan's scans of ``table`` (EXPLAIN ANALYZE, JSON)."""
    own = [plan] if plan.get("Relation Name") == table else []
    return own + [scan for child in plan.get("Plans", []) for scan in scans(child, table)]


def test_list_queries_read_an_index_on_a_large_table(client: Client, viewer: User, operator: User) -> None:
    """Each page reads a tenth of a 30,000-job table at most (most read a few dozen rows), through an index,
    whatever the filters, sort and depth."""
    copy_jobs(30_000, [viewer, operator] + [User.objects.create_user(f"u{i}") for i in range(8)])
    client.force_login(viewer)
    table = Job._meta.db_table
    cases: list[dict[str, str]] = [
        {},
        {"sort": "name"},
        {"sort": "-priority"},
        {"sort": "created_at"},
        {"state": "RUNNING"},
        {"owner": operator.username},
        {"name": "vit-12"},
        {"name": "gpt-99"},  # a rare prefix under the default sort
        {"name": "gpt-99", "sort": "name"},
        {"name": "t5-7", "sort": "-priority"},
        {"name": "nothing-like-this"},
        {"state": "FAILED", "owner": "u3", "sort": "-created_at"},
    ]
    for params in cases:
        first = client.get("/jobs/", params)
        assert first.status_code == 200, params
        # The first page and a page after a cursor, each explained.
        pages = [params]
        if first.context["next_url"]:
            pages.append(dict(parse_qsl(html.unescape(first.context["next_url"]).lstrip("?"))))
        for page_params in pages:
            with CaptureQueriesContext(connection) as ran:
                client.get("/jobs/", page_params)
            lists = [q["sql"] for q in ran.captured_queries if f'FROM "{table}"' in q["sql"]]
            assert len(lists) == 1, lists
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + lists[0])
                plan = cur.fetchone()[0][0]["Plan"]
            text = json.dumps(plan)
            jobs_scans = scans(plan, table)
            assert jobs_scans and all(scan["Node Type"] != "Seq Scan" for scan in jobs_scans), (
                page_params,
                text,
            )
            assert '"Index Name"' in text, (page_params, text)
            read = sum(scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0) for scan in jobs_scans)
            assert read < 3000, (page_params, read, text)  # a tenth of the table at most
