"""Given the controller's database connection was cut (the server ended the session, as in a
PostgreSQL restart), when an agent's report arrives, then the task is tried again on a new
connection and the report is recorded once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from celery.signals import task_retry
from django.conf import settings
from django.db import connection

from console.cluster import tasks as cluster_tasks
from console.jobs import scheduler
from console.jobs import tasks as job_tasks
from console.jobs.models import Allocation
from tests.support.controller import database_url
from tests.support.decisions import failing_exit, make_job, make_node
from tests.support.reports import sealed


@pytest.fixture
def retries() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(sender: Any = None, reason: Any = None, **_: Any) -> None:
        seen.append(type(reason.exc).__name__)

    task_retry.connect(record)
    yield seen
    task_retry.disconnect(record)


def cut_this_threads_connection() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_report_on_a_cut_connection_is_retried_and_recorded_once(
    transactional_db: None, retries: list[str]
) -> None:
    make_node("a")
    job = make_job("steady", nnodes="1")
    scheduler.schedule()
    clean = {**failing_exit(), "exit_code": 0, "error": ""}

    cut_this_threads_connection()
    result = job_tasks.rank_exited.apply(
        kwargs=sealed(
            settings.NODE_TOKEN, job_tasks.rank_exited.name, node="a", job_id=job.pk, round=1, exit=clean
        ),
        throw=False,  # an eager retry is raised as an exception when thrown
    )

    assert result.successful(), result.traceback
    assert retries == ["OperationalError"]
    assert Allocation.objects.get(round__job=job).exit_info["exits"] == [clean]


def test_a_heartbeat_on_a_cut_connection_is_retried_on_a_new_one(
    transactional_db: None, retries: list[str]
) -> None:
    node = make_node("a", session="s-a")

    cut_this_threads_connection()
    result = cluster_tasks.heartbeat.apply(
        kwargs=sealed(
            settings.NODE_TOKEN,
            cluster_tasks.heartbeat.name,
            node="a",
            session="s-a",
            load={"cpu_percent": 37.5, "memory_percent": 1.0, "gpus": []},
            rounds=[],
        ),
        throw=False,
    )

    assert result.successful(), result.traceback
    assert retries == ["OperationalError"]
    node.refresh_from_db()
    assert node.cpu_percent == 37.5
