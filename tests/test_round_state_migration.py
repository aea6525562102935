"""Given rounds stored when a round's life was six fields (outcome, ended_at, awaiting_settlement,
failed_at, formed_at, carry_over), when jobs' migrations 0007 and 0008 run, then each round gets
the one state those fields meant, its outcome only once it ended, and the constraints hold."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("jobs", "0006_inplace_rounds"), ("cluster", "0003_node_credentials")]
AFTER = [("jobs", "0008_round_state_constraints")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def migrate_to_latest() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_old_rounds_get_the_state_their_fields_meant(transactional_db: None) -> None:
    old = migrate(BEFORE)
    Job, Round, Allocation, Node = (
        old.get_model(*m)
        for m in (("jobs", "Job"), ("jobs", "Round"), ("jobs", "Allocation"), ("cluster", "Node"))
    )
    node = Node.objects.create(name="a", slots=2)
    job = Job.objects.create(name="old", entrypoint="/bin/true", state="RUNNING", round_number=7)
    now = timezone.now()
    carry = {"from_round": 1, "ranks": {"0": 0}}
    rows: dict[str, dict[str, Any]] = {
        "ended": {"outcome": "replaced", "ended_at": now},
        "ended without an outcome": {"outcome": "", "ended_at": now},
        "failed, settling": {"outcome": "failed", "awaiting_settlement": True, "failed_at": now},
        "failed, never stamped": {"outcome": "failed"},
        "in place, forming": {"carry_over": carry},
        "in place, formed": {"carry_over": carry, "formed_at": now},
        "fresh, a host running": {},
        "fresh, no word yet": {},
    }
    made = {}
    for number, (name, fields) in enumerate(rows.items(), start=1):
        made[name] = Round.objects.create(
            job=job, number=number, reason="start", world_size=1, master_addr="h", master_port=20000, **fields
        )
    Allocation.objects.create(
        round=made["fresh, a host running"], node=node, node_rank=0, nproc=1, state="RUNNING"
    )
    Allocation.objects.create(
        round=made["in place, forming"], node=node, node_rank=0, nproc=1, state="RUNNING", inplace="pending"
    )

    try:
        new = migrate(AFTER)
        Round, Allocation = new.get_model("jobs", "Round"), new.get_model("jobs", "Allocation")
        got = {
            name: Round.objects.filter(pk=rnd.pk).values("state", "outcome", "inplace").get()
            for name, rnd in made.items()
        }
        assert got == {
            "ended": {"state": "ended", "outcome": "replaced", "inplace": False},
            "ended without an outcome": {"state": "ended", "outcome": "replaced", "inplace": False},
            "failed, settling": {"state": "settling", "outcome": None, "inplace": False},
            "failed, never stamped": {"state": "settling", "outcome": None, "inplace": False},
            "in place, forming": {"state": "forming", "outcome": None, "inplace": True},
            "in place, formed": {"state": "running", "outcome": None, "inplace": True},
            "fresh, a host running": {"state": "running", "outcome": None, "inplace": False},
            "fresh, no word yet": {"state": "starting", "outcome": None, "inplace": False},
        }
        unstamped = Round.objects.get(pk=made["failed, never stamped"].pk)
        assert unstamped.failed_at == unstamped.created_at
        assert Allocation.objects.get(round_id=made["in place, forming"].pk).inplace == "forming"
        # The constraints hold the columns to the state: an ended round without an outcome is refused
        with pytest.raises(IntegrityError), transaction.atomic():
            Round.objects.filter(pk=made["ended"].pk).update(outcome=None)
        with pytest.raises(IntegrityError), transaction.atomic():
            Round.objects.filter(pk=made["fresh, no word yet"].pk).update(state="forming")
        with pytest.raises(IntegrityError), transaction.atomic():
            Round.objects.filter(pk=made["fresh, no word yet"].pk).update(ended_at=now + timedelta(seconds=1))
    finally:
        migrate_to_latest()  # whatever happens, the next tests get the current schema
