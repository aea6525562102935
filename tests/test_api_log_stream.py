"""Following a job's logs as Server-Sent Events through a real Daphne: past lines on request,
new lines as they are committed, resume by Last-Event-ID, and an end event once the job ends."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from console.api.models import ApiToken
from console.jobs.models import Job
from console.telemetry.models import LogLine

pytestmark = pytest.mark.django_db(transaction=True)


def add_lines(job: Job, seqs: range, rank: int = 0) -> None:
    now = datetime.now(UTC)
    LogLine.objects.bulk_create(
        LogLine(job=job, round_number=1, rank=rank, stream="stdout", seq=s, text=f"line {s}", time=now)
        for s in seqs
    )


def events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """SSE events as {"event", "id", "data"}; comments are skipped."""
    current: dict[str, Any] = {}
    for raw in response.iter_lines(decode_unicode=True):
        if raw == "":
            if current:
                yield current
            current = {}
        elif raw.startswith(":"):
            continue
        else:
            key, _, value = raw.partition(": ")
            current[key] = json.loads(value) if key == "data" else value


@pytest.fixture
def token(viewer: User) -> str:
    return ApiToken.issue(viewer, "logs", ["read"])[1]


def test_stream_sends_tail_then_new_lines_then_ends(console_url: str, token: str) -> None:
    job = Job.objects.create(name="s", workload="digits-mlp", state="RUNNING", round_number=1)
    add_lines(job, range(5))
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    url = f"{console_url}/api/v1/jobs/{job.pk}/logs/stream/"
    with requests.get(url, params={"tail": 2}, headers=headers, stream=True, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        stream = events(response)
        first = [next(stream), next(stream)]
        assert [e["data"]["text"] for e in first] == ["line 3", "line 4"]
        assert first[1]["id"] == str(first[1]["data"]["id"])

        started = time.monotonic()
        threading.Timer(0.5, add_lines, args=(job, range(5, 8))).start()
        later = [next(stream) for _ in range(3)]
        assert [e["data"]["text"] for e in later] == ["line 5", "line 6", "line 7"]
        assert time.monotonic() - started < 10

        Job.objects.filter(pk=job.pk).update(state="STOPPED")
        end = next(stream)
        assert end["event"] == "end" and end["data"] == {
            "reason": "finished",
            "last_id": int(later[-1]["id"]),
        }

    # A reconnect with Last-Event-ID gets what came after, and nothing twice.
    resumed = requests.get(url, headers={**headers, "Last-Event-ID": first[0]["id"]}, stream=True, timeout=30)
    texts = [e["data"]["text"] for e in events(resumed) if e.get("event") == "line"]
    assert texts == ["line 4", "line 5", "line 6", "line 7"]


def test_stream_filters_and_refuses_bad_input(console_url: str, token: str) -> None:
    job = Job.objects.create(name="s", workload="digits-mlp", state="SUCCEEDED", round_number=1)
    add_lines(job, range(3), rank=0)
    add_lines(job, range(3), rank=1)
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{console_url}/api/v1/jobs/{job.pk}/logs/stream/"
    only_rank_1 = requests.get(url, params={"after": "0", "rank": "1"}, headers=headers, timeout=30)
    lines = [e["data"] for e in events(only_rank_1) if e.get("event") == "line"]
    assert [(ln["rank"], ln["seq"]) for ln in lines] == [(1, 0), (1, 1), (1, 2)]

    bad = requests.get(url, params={"rank": "x", "timeout": "0"}, headers=headers, timeout=30)
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"rank", "timeout"}
    assert requests.get(url, timeout=30).status_code == 401
    missing = requests.get(f"{console_url}/api/v1/jobs/999999/logs/stream/", headers=headers, timeout=30)
    assert missing.status_code == 404 and missing.json()["detail"]
