"""The dashboard's pending queue: placement order and why each job waits; the node page's
holdings. Decided from the scheduler's own capacity view, in-process."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.jobs.models import Allocation, Job, Round
from console.web.nodes import node_context, pending_queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_gpu_nodes() -> list[Node]:
    nodes = []
    for name in ("g1", "g2"):
        node = Node.objects.create(name=name, slots=4, last_heartbeat=timezone.now())
        for i in range(2):
            Gpu.objects.create(node=node, index=i, name="L4")
        nodes.append(node)
    return nodes


def test_queue_in_placement_order_with_reasons(two_gpu_nodes: list[Node]) -> None:
    # Given a running job holding both GPUs of g1, and three pending jobs
    running = Job.objects.create(name="r", workload="mlp", state="RUNNING", round_number=1, gpus_per_proc=1)
    rnd = Round.objects.create(
        job=running, number=1, reason="start", world_size=2, master_addr="h", master_port=1
    )
    Allocation.objects.create(
        round=rnd, node=two_gpu_nodes[0], node_rank=0, nproc=2, gpu_indices=[0, 1], state="RUNNING"
    )
    later = Job.objects.create(name="later", workload="mlp")
    big = Job.objects.create(
        name="big",
        workload="mlp",
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        gpus_per_proc=1,
        nproc_per_node=2,
        priority=3,
    )
    Job.objects.create(name="done", workload="mlp", state="SUCCEEDED")
    # When the queue is read
    queue = pending_queue()
    # Then the higher priority comes first and says what it lacks; the later one waits behind it
    assert [(e.position, e.job.name) for e in queue] == [(1, "big"), (2, "later")]
    assert queue[0].why.startswith("Needs 2 node(s) with 2 free GPU(s) each; 1 has room now.")
    assert queue[1].why.startswith(f"Fits, but waits behind #{big.pk} big")
    assert later.pk == queue[1].job.pk


def test_first_job_that_fits_is_about_to_be_placed(two_gpu_nodes: list[Node]) -> None:
    Job.objects.create(name="small", workload="mlp")
    assert pending_queue()[0].why.startswith("Fits on 2 node(s)")


def test_node_page_lists_what_the_node_holds_and_held(
    two_gpu_nodes: list[Node], viewer: User, client: Client
) -> None:
    job = Job.objects.create(name="j", workload="mlp", state="RUNNING", round_number=2)
    for number in (1, 2):
        rnd = Round.objects.create(
            job=job, number=number, reason="start", world_size=1, master_addr="h", master_port=1
        )
        Allocation.objects.create(
            round=rnd,
            node=two_gpu_nodes[1],
            node_rank=0,
            nproc=1,
            gpu_indices=[1],
            state="RUNNING" if number == 2 else "STOPPED",
        )
    context = node_context(two_gpu_nodes[1])
    assert [a.round.number for a in context["holding"]] == [2]
    assert [a.round.number for a in context["history"]] == [1]
    assert context["gpus_used"] == [1]
    client.force_login(viewer)
    page = client.get("/nodes/g2/").content.decode()
    assert 'id="holding-table"' in page and "data-node-action" not in page
    assert client.get("/nodes/nope/").status_code == 404


def test_a_parameter_server_jobs_fits_agrees_with_planning(two_gpu_nodes: list[Node]) -> None:
    from console.jobs.snapshot import snapshot

    # Given two 4-slot nodes, one of them with 2 slots taken, and a pending parameter-server job
    # of 2 nodes whose 7 processes (coordinator, 2 PS, 4 workers) need 4 slots a node: it has
    # nproc_per_node 1, which a view built by hand took for its need
    holder = Job.objects.create(name="holder", workload="mlp", state="RUNNING", round_number=1)
    rnd = Round.objects.create(
        job=holder, number=1, reason="start", world_size=2, master_addr="h", master_port=1
    )
    Allocation.objects.create(round=rnd, node=two_gpu_nodes[1], node_rank=0, nproc=2, state="RUNNING")
    ps = Job.objects.create(
        name="ps",
        entrypoint="/bin/true",
        min_nodes=2,
        max_nodes=2,
        desired_nodes=2,
        strategy="parameter_server",
        roles={"ps": {"count": 2, "mode": "async"}, "worker": {"count": 4, "min": 1, "max": 8}},
    )
    # When the queue is read, then it says what planning says: one node has room, two are needed
    planned = snapshot(ps)
    assert [n.name for n in planned.fitting()] == ["g1"] and planned.shortfall() == 1
    (entry,) = pending_queue()
    assert entry.why.startswith("Needs 2 node(s) with 4 free slot(s) each; 1 has room now."), entry.why
