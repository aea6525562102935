"""End to end (real controller, agents and gloo ranks): an SDK job (sdk.elastic, ``elastic:
inplace``) grows 2 -> 3 when a node arrives and is resized back to 2 through the API, both in
place: the survivors keep their processes, the step never goes back, and every example of the
epoch is seen exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from console.core.states import JobState, RoundReason
from console.jobs.models import Job
from tests.support.cluster import Cluster
from tests.support.controller import wait_for

SCRIPT = Path(__file__).parent / "scripts" / "elastic_count.py"
EXAMPLES = 3000


def lines(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def steps_at(record: Path, world: int) -> int:
    return sum(1 for line in lines(record) if line.get("world") == world)


@pytest.mark.cluster
def test_an_sdk_job_grows_and_shrinks_in_place(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b")
    record, fast = cluster.root / "record.jsonl", cluster.root / "fast"
    body: dict[str, Any] = {
        "name": "sdk-inplace",
        "entrypoint": str(SCRIPT),
        "workdir": str(SCRIPT.parent),
        "args": [
            "--record",
            str(record),
            "--examples",
            str(EXAMPLES),
            "--step-sleep",
            "0.05",
            "--fast-file",
            str(fast),
        ],
        "nnodes": "1:3",
        "nproc_per_node": 1,
        "grace_period": 10,
        "elastic": "inplace",
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    job.progress_file = record  # type: ignore[attr-defined]  # for cluster.diagnose
    wait_for(lambda: steps_at(record, 2) >= 6, timeout=90, message="steps at world 2")

    # When a third node arrives, the job grows onto it in place; then the operator shrinks it
    cluster.start_agents("node-c")
    wait_for(lambda: steps_at(record, 3) >= 9, timeout=90, message="steps at world 3")
    # (a change while the previous one is still forming would restart: wait for the heartbeats)
    wait_for(
        lambda: job.rounds.filter(number=2, formed_at__isnull=False).exists(), timeout=30, message="formed"
    )
    response = cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": 2}, format="json")
    assert response.status_code == 200, response.content
    wait_for(lambda: any(line.get("round") == 3 for line in lines(record)), timeout=60, message="round 3")
    fast.touch()
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)

    # Then both changes were in-place rounds that formed, with no fallback and no restart
    rounds = list(job.rounds.order_by("number"))
    assert [(r.reason, r.world_size, r.inplace) for r in rounds] == [
        (RoundReason.START, 2, False),
        (RoundReason.AUTOSCALE, 3, True),
        (RoundReason.RESIZE, 2, True),
    ], [(r.reason, r.world_size, r.inplace) for r in rounds]
    assert all(r.formed_at is not None for r in rounds[1:]) and job.restarts == 0
    steps = [line for line in lines(record) if "indices" in line]
    # the two first ranks ran in the same processes from round 1 to round 3
    for rank in (0, 1):
        mine = [line for line in steps if line["rank"] == rank]
        assert {line["round"] for line in mine} == {1, 2, 3} and len({line["pid"] for line in mine}) == 1
    # the step never went back, and the newcomer started from the survivors' parameters
    for pid in {line["pid"] for line in steps}:
        own = [line["step"] for line in steps if line["pid"] == pid]
        assert own == sorted(own) and len(own) == len(set(own))
    joined = min(line["step"] for line in steps if line["world"] == 3 and line["rank"] == 2)
    assert len({line["checksum"] for line in steps if line["step"] == joined}) == 1
    counted = Counter(i for line in steps for i in line["indices"])
    assert sorted(counted) == list(range(EXAMPLES)) and set(counted.values()) == {1}
