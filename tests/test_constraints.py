"""The database refuses records that break the data's rules, whatever code writes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from console.cluster.models import Gpu, Node
from console.jobs.models import Allocation, Job, Round

pytestmark = pytest.mark.django_db


def job(**overrides: Any) -> Job:
    fields: dict[str, Any] = {
        "name": "j",
        "workload": "mlp",
        "min_nodes": 1,
        "max_nodes": 2,
        "desired_nodes": 1,
    }
    fields.update(overrides)
    return Job.objects.create(**fields)


def node(name: str) -> Node:
    return Node.objects.create(name=name, cpus=2)


def round_of(j: Job, number: int = 1, **overrides: Any) -> Round:
    fields: dict[str, Any] = {
        "job": j,
        "number": number,
        "reason": "start",
        "world_size": 2,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
    }
    fields.update(overrides)
    return Round.objects.create(**fields)


def refused(create: Callable[[], object]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        create()


def test_min_nodes_above_max_nodes_is_refused() -> None:
    refused(lambda: job(min_nodes=3, max_nodes=2, desired_nodes=2))


def test_desired_nodes_outside_the_range_is_refused() -> None:
    refused(lambda: job(min_nodes=2, max_nodes=4, desired_nodes=5))
    refused(lambda: job(min_nodes=2, max_nodes=4, desired_nodes=1))


@pytest.mark.parametrize(
    "field",
    ["min_nodes", "nproc_per_node", "grad_accum_steps"],
)
def test_zero_where_a_job_needs_at_least_one_is_refused(field: str) -> None:
    overrides: dict[str, Any] = {field: 0}
    if field == "min_nodes":
        overrides["desired_nodes"] = 1
    refused(lambda: job(**overrides))


@pytest.mark.parametrize("field", ["max_restarts", "restarts", "gpus_per_proc", "round_number"])
def test_negative_counts_are_refused(field: str) -> None:
    refused(lambda: job(**{field: -1}))


def test_negative_grace_period_is_refused() -> None:
    refused(lambda: job(grace_period=-1.0))


def test_job_without_workload_or_entrypoint_is_refused() -> None:
    refused(lambda: job(workload="", entrypoint=""))


def test_a_valid_job_and_round_are_accepted() -> None:
    j = job(min_nodes=2, max_nodes=4, desired_nodes=3)
    r = round_of(j)
    Allocation.objects.create(round=r, node=node("a"), node_rank=0, nproc=1)
    assert Round.objects.filter(job=j).count() == 1
    assert r.allocations.count() == 1


def test_duplicate_round_number_for_a_job_is_refused() -> None:
    j = job()
    round_of(j, 1)
    refused(lambda: round_of(j, 1))
    # The same number in another job is fine.
    round_of(job(name="other"), 1)


@pytest.mark.parametrize(
    "overrides", [{"number": 0}, {"world_size": 0}, {"master_port": 0}, {"master_port": 70000}]
)
def test_round_with_impossible_numbers_is_refused(overrides: dict[str, Any]) -> None:
    j = job()
    refused(lambda: round_of(j, **overrides))


def test_duplicate_node_rank_in_a_round_is_refused() -> None:
    r = round_of(job())
    Allocation.objects.create(round=r, node=node("a"), node_rank=0, nproc=1)
    refused(lambda: Allocation.objects.create(round=r, node=node("b"), node_rank=0, nproc=1))


def test_a_node_twice_in_one_round_is_refused() -> None:
    r = round_of(job())
    a = node("a")
    Allocation.objects.create(round=r, node=a, node_rank=0, nproc=1)
    refused(lambda: Allocation.objects.create(round=r, node=a, node_rank=1, nproc=1))


def test_allocation_without_processes_is_refused() -> None:
    r = round_of(job())
    refused(lambda: Allocation.objects.create(round=r, node=node("a"), node_rank=0, nproc=0))


def test_duplicate_gpu_index_on_a_node_is_refused() -> None:
    a = node("a")
    Gpu.objects.create(node=a, index=0, name="A100")
    refused(lambda: Gpu.objects.create(node=a, index=0, name="A100"))
    Gpu.objects.create(node=node("b"), index=0, name="A100")


def test_duplicate_node_name_is_refused() -> None:
    node("a")
    refused(lambda: node("a"))
