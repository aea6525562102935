"""End to end (real controller, agents and gloo ranks): an SDK job (sdk.elastic, ``elastic:
inplace``) grows 2 -> 3 when a node arrives, is resized to 1 and back to 2 through the API, all
in place: the survivors keep their processes, the step never goes back, each newcomer starts from
a survivor's parameters, and every example of the epoch is seen exactly once. And when the
newcomer cannot re-form, the controller falls back to restarting every rank, uncharged."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from console.core.states import JobState, RoundReason
from console.jobs.models import Job
from console.telemetry.models import Event
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
def test_an_sdk_job_resized_2_3_1_2_stays_in_place(cluster: Cluster) -> None:
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

    # When a third node arrives, the job grows onto it in place
    cluster.start_agents("node-c")
    wait_for(lambda: steps_at(record, 3) >= 9, timeout=90, message="steps at world 3")
    wait_formed(job, 2)
    # then the operator shrinks it to one node (a group of one) and grows it back to two
    resize(cluster, job, 1, round_no=3)
    wait_for(lambda: steps_at(record, 1) >= 6, timeout=60, message="steps at world 1")
    wait_formed(job, 3)
    resize(cluster, job, 2, round_no=4)
    wait_for(lambda: any(line.get("round") == 4 for line in lines(record)), timeout=60, message="round 4")
    fast.touch()
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)

    # Then every change was an in-place round that formed, with no fallback and no restart
    rounds = list(job.rounds.order_by("number"))
    assert [(r.reason, r.world_size, r.inplace) for r in rounds] == [
        (RoundReason.START, 2, False),
        (RoundReason.AUTOSCALE, 3, True),
        (RoundReason.RESIZE, 1, True),
        (RoundReason.RESIZE, 2, True),
    ], [(r.reason, r.world_size, r.inplace) for r in rounds]
    assert all(r.formed_at is not None for r in rounds[1:]) and job.restarts == 0
    steps = [line for line in lines(record) if "indices" in line]
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for line in steps:
        by_pid.setdefault(line["pid"], []).append(line)
    # rank 0 ran in one process from round 1 to round 4; the only other processes are the two
    # that started the job's round 1 and the newcomer of round 2 and of round 4 (none restarted)
    (first,) = {line["pid"] for line in steps if line["rank"] == 0}
    assert {line["round"] for line in by_pid[first]} == {1, 2, 3, 4}
    started_in = sorted(min(line["round"] for line in own) for own in by_pid.values())
    assert started_in == [1, 1, 2, 4], started_in
    # the step never went back, and each newcomer started from the survivors' parameters
    for own in by_pid.values():
        own_steps = [line["step"] for line in own]
        assert own_steps == sorted(own_steps) and len(own_steps) == len(set(own_steps))
    for joined_round in (2, 4):
        (newcomer,) = [own for own in by_pid.values() if own[0]["round"] == joined_round]
        joined = newcomer[0]["step"]
        at_join = [line["checksum"] for line in steps if line["step"] == joined]
        assert len(at_join) == newcomer[0]["world"] and len(set(at_join)) == 1, (joined_round, at_join)
    # every example of the epoch was seen exactly once
    counted = Counter(i for line in steps for i in line["indices"])
    assert sorted(counted) == list(range(EXAMPLES)) and set(counted.values()) == {1}


@pytest.mark.alone  # the survivors' old round must outlast a newcomer's start-up: load-bound
@pytest.mark.cluster
def test_a_newcomer_that_cannot_re_form_makes_the_round_fall_back_to_a_restart(cluster: Cluster) -> None:
    cluster.start_agents("node-a", "node-b")
    record, fast, broken = cluster.root / "record.jsonl", cluster.root / "fast", cluster.root / "broken"
    body: dict[str, Any] = {
        "name": "sdk-fallback",
        "entrypoint": str(SCRIPT),
        "workdir": str(SCRIPT.parent),
        "args": [
            # 1800 examples: the survivors train on in the old round for ~20 s while the newcomer
            # starts (600 were done in 7 s, before a newcomer on a loaded machine reached the store)
            *("--record", str(record), "--examples", "1800", "--step-sleep", "0.05"),
            *("--fast-file", str(fast), "--break-join", str(broken)),
        ],
        "nnodes": "1:3",
        "nproc_per_node": 1,
        "grace_period": 10,
        "max_restarts": 1,
        "elastic": "inplace",
    }
    response = cluster.api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    job.progress_file = record  # type: ignore[attr-defined]  # for cluster.diagnose
    wait_for(lambda: steps_at(record, 2) >= 6, timeout=90, message="steps at world 2")

    # When a third node arrives and the job's newcomer there cannot take the survivors' state
    broken.touch()
    cluster.start_agents("node-c")
    wait_for(lambda: any(line.get("round") == 3 for line in lines(record)), timeout=60, message="round 3")
    fast.touch()
    job = cluster.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state == JobState.SUCCEEDED, cluster.diagnose(job)

    # Then the in-place round fell back to a round on the same nodes, uncharged, and said why
    assert not broken.exists()  # the newcomer took the file: it was the one that failed
    rounds = list(job.rounds.order_by("number"))
    assert [(r.reason, r.world_size, r.inplace) for r in rounds] == [
        (RoundReason.START, 2, False),
        (RoundReason.AUTOSCALE, 3, True),
        (RoundReason.FALLBACK, 3, False),
    ], cluster.diagnose(job)
    assert rounds[1].formed_at is None and job.restarts == 0
    (failed,) = Event.objects.filter(job=job, kind="round.inplace_failed")
    # the first word to reach the controller says why: a host's SDK report (the newcomer's bad
    # state, or a survivor's closed connection to it), or a rank's exit before the round formed
    assert failed.round_number == 2 and re.fullmatch(
        r"node-[abc]: forming round 2 failed: .+|rank [012] on node-[abc] ended with exit code 3(: .+)?",
        failed.data["reason"],
        flags=re.DOTALL,
    ), failed.data
    # every rank of the fallback round started afresh: new processes, from step 0
    steps = [line for line in lines(record) if "indices" in line]
    before = {line["pid"] for line in steps if line["round"] < 3}
    after = [line for line in steps if line["round"] == 3]
    assert len({line["pid"] for line in after}) == 3 and not before & {line["pid"] for line in after}
    assert sorted({line["rank"] for line in after if line["step"] == 0}) == [0, 1, 2]


def resize(cluster: Cluster, job: Job, nodes: int, round_no: int) -> None:
    response = cluster.api.post(f"/api/v1/jobs/{job.pk}/resize/", {"nodes": nodes}, format="json")
    assert response.status_code == 200, response.content
    wait_for(lambda: job.rounds.filter(number=round_no).exists(), timeout=30, message=f"round {round_no}")


def wait_formed(job: Job, round_no: int) -> None:
    # (a change while the previous one is still forming would restart: wait for the heartbeats)
    wait_for(
        lambda: job.rounds.filter(number=round_no, formed_at__isnull=False).exists(),
        timeout=30,
        message=f"round {round_no} formed",
    )
