"""Given rounds stored before reasons and outcomes were enums, when jobs' migration 0003 runs, then
"scale" rounds become autoscale, preemption or drain by the event that explained them, outcomes
become RoundOutcome values, and a failure still awaiting settlement is flagged as such."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("jobs", "0002_round_failure"), ("telemetry", "0003_metric_without_db_foreign_key")]
AFTER = [("jobs", "0003_round_reasons_and_outcomes")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def migrate_to_latest() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_old_rounds_get_their_reasons_and_outcomes(transactional_db: None) -> None:
    old = migrate(BEFORE)
    Job, Round, Event = (
        old.get_model(*m) for m in (("jobs", "Job"), ("jobs", "Round"), ("telemetry", "Event"))
    )
    job = Job.objects.create(
        name="old", entrypoint="/bin/true", min_nodes=1, max_nodes=3, state="RUNNING", round_number=5
    )
    waiting = Job.objects.create(name="waiting", entrypoint="/bin/true", state="RESTARTING", round_number=1)
    plan = [("start", "scale"), ("scale", "pending"), ("resume", "scale"), ("scale", "scale"), ("scale", "")]
    for number, (reason, outcome) in enumerate(plan, start=1):
        Round.objects.create(
            job=job,
            number=number,
            reason=reason,
            outcome=outcome,
            world_size=1,
            master_addr="h",
            master_port=20000,
        )
    Round.objects.create(
        job=waiting,
        number=1,
        reason="start",
        outcome="failed",
        world_size=1,
        master_addr="h",
        master_port=20000,
    )
    # Before round 2 the job was shrunk for another job; before round 4 it moved off a draining node.
    Event.objects.create(job=job, round_number=1, kind="job.shrunk", message="shrinking")
    Event.objects.create(job=job, round_number=3, kind="job.drained_off", message="moving off")
    Event.objects.create(job=job, round_number=2, kind="round.scale", message="Round 2")

    try:
        new = migrate(AFTER)
        # Read at 0003 (0007 later maps these rows on: tests/test_round_state_migration.py)
        Round, Event = new.get_model("jobs", "Round"), new.get_model("telemetry", "Event")
        rounds = list(Round.objects.filter(job_id=job.pk).order_by("number").values_list("reason", "outcome"))
        relabelled = Event.objects.get(job_id=job.pk, round_number=2).kind
        flagged = Round.objects.get(job_id=waiting.pk)
    finally:
        migrate_to_latest()  # whatever happens, the next tests get the current schema

    assert rounds == [
        ("start", "replaced"),
        ("preemption", "requeued"),
        ("resume", "replaced"),
        ("drain", "replaced"),
        ("autoscale", ""),
    ]
    assert relabelled == "round.preemption"
    assert (flagged.outcome, flagged.awaiting_settlement) == ("failed", True)
