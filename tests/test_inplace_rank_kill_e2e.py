"""End to end (real controller, agents and gloo ranks), in-place recovery being the default: an
SDK job on two agents with two ranks each loses rank 3 to SIGKILL; the three survivors, rank 2 on
the same host among them, keep their processes, wait for the next round, re-form with a newcomer
in its place, and the job succeeds with every example of the epoch seen exactly once (counting the
steps that completed)."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from console.core.states import JobState, RoundReason
from console.jobs.models import Job
from tests.support.cluster import Cluster
from tests.support.controller import wait_for

SCRIPT = Path(__file__).parent / "scripts" / "elastic_count.py"
EXAMPLES = 1500


def lines(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


@pytest.mark.cluster
def test_a_sigkilled_rank_is_replaced_in_place_and_the_survivors_keep_their_processes(
    cluster: Cluster,
) -> None:
    cluster.start_agents("node-a", "node-b")
    record, fast = cluster.root / "record.jsonl", cluster.root / "fast"
    body: dict[str, Any] = {
        "name": "sdk-rank-kill",
        "entrypoint": str(SCRIPT),
        "workdir": str(SCRIPT.parent),
        "args": [
            *("--record", str(record), "--examples", str(EXAMPLES)),
            *("--step-sleep", "0.05", "--fast-file", str(fast)),
        ],
        "nnodes": "2",
        "nproc_per_node": 2,
        "grace_period": 10,
        "max_restarts": 2,
        "elastic": "inplace",
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    job.progress_file = record  # type: ignore[attr-defined]  # for cluster.diagnose
    wait_for(lambda: sum("indices" in r for r in lines(record)) >= 24, timeout=90, message="steps at world 4")

    # When rank 3 (node-b's second rank) is SIGKILLed mid-training
    victim = next(r["pid"] for r in reversed(lines(record)) if r.get("rank") == 3 and "indices" in r)
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: any(r.get("round") == 2 for r in lines(record) if "indices" in r),
        timeout=60,
        message="round 2",
    )
    fast.touch()
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)

    # Then round 2 was an in-place failure round, charged, that formed
    rounds = list(job.rounds.order_by("number"))
    assert [(r.reason, r.world_size, r.inplace) for r in rounds] == [
        (RoundReason.START, 4, False),
        (RoundReason.FAILURE, 4, True),
    ], cluster.diagnose(job)
    assert rounds[1].formed_at is not None and job.restarts == 1
    steps = [r for r in lines(record) if "indices" in r]
    # ranks 0, 1 and 2 kept their processes from round 1 to round 2; the step never went back
    for rank in (0, 1, 2):
        mine = [r for r in steps if r["rank"] == rank]
        assert {r["round"] for r in mine} == {1, 2} and len({r["pid"] for r in mine}) == 1
        own = [r["step"] for r in mine]
        assert own == sorted(own)
    # completed steps: each process's last attempt at a step; the victim's only for steps whose
    # survivors' last attempt was still in round 1
    final: dict[tuple[int, int], dict[str, Any]] = {}
    for r in steps:
        final[(r["pid"], r["step"])] = r
    survivors = {r["pid"] for r in steps if r["round"] == 2 and r["rank"] in (0, 1, 2)}
    done_in_1 = {s for (pid, s), r in final.items() if pid in survivors and r["round"] == 1}
    counted = Counter(
        i for (pid, s), r in final.items() if pid != victim or s in done_in_1 for i in r["indices"]
    )
    assert sorted(counted) == list(range(EXAMPLES)) and set(counted.values()) == {1}
    # the newcomer started from the survivors' parameters
    joined = min(r["step"] for r in steps if r["round"] == 2 and r["rank"] == 3)
    assert len({final[(pid, joined)]["checksum"] for pid, s in final if s == joined}) == 1
