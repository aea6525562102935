"""Reads what planning needs from the database: nodes with their free capacity, jobs' members.

The one place that turns rows into console/jobs/planning.py's plain dataclasses. A node's free
capacity is its slots and GPUs less what the live rounds of the other jobs hold.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core.states import AllocationState, JobState, NodeState
from console.jobs.models import Allocation, Job, Round
from console.jobs.planning import JobView, NodeView, Process, Snapshot

# A listener's port is not handed out again on its node for this long after its round began
# (or while its round lives): long enough for any socket of that round to be gone.
PORT_REUSE_AFTER = timedelta(hours=1)


def live_allocations() -> QuerySet[Allocation]:
    """Allocations whose ranks may be running: the current round of every active job."""
    return Allocation.objects.filter(
        round__job__state__in=[s.value for s in JobState if s.is_active],
        round__number=F("round__job__round_number"),
        state__in=[s.value for s in AllocationState if s.is_live],
    )


def members(rnd: Round | None) -> list[Node]:
    """A round's nodes in node-rank order."""
    if rnd is None:
        return []
    return [a.node for a in rnd.allocations.select_related("node").order_by("node_rank")]


def job_view(job: Job) -> JobView:
    rnd = job.current_round()
    return JobView(
        id=job.pk,
        name=job.name,
        min_nodes=job.min_nodes,
        max_nodes=job.max_nodes,
        desired_nodes=job.desired_nodes,
        nproc_per_node=job.nproc_per_node,
        gpus_per_proc=job.gpus_per_proc,
        priority=job.priority,
        members=tuple(n.pk for n in members(rnd)),
        round_number=rnd.number if rnd is not None else 0,
        round_open=rnd is not None and not rnd.ended,
        ps_count=job.role_count("ps") if job.is_parameter_server else 0,
        workers=job.role_count("worker") if job.is_parameter_server else 0,
        hybrid=job.is_parameter_server and job.roles.get("ps", {}).get("mode") == "hybrid",
        inplace=job.inplace and not job.is_parameter_server,
    )


def node_views(exclude_job: Job | None = None) -> dict[int, NodeView]:
    """Every node with the capacity that live rounds (other than ``exclude_job``'s) leave free."""
    nodes = list(Node.objects.order_by("name"))
    gpus: dict[int, list[int]] = {n.pk: [] for n in nodes}
    for node_id, index in Gpu.objects.order_by("index").values_list("node_id", "index"):
        gpus.setdefault(node_id, []).append(index)
    used_slots: dict[int, int] = {}
    used_gpus: dict[int, set[int]] = {}
    ports = recent_ports()
    held = live_allocations().select_related("round__job")
    if exclude_job is not None:
        held = held.exclude(round__job=exclude_job)
    for alloc in held:
        if alloc.round.job.gpus_per_proc:
            used_gpus.setdefault(alloc.node_id, set()).update(alloc.gpu_indices)
        else:
            used_slots[alloc.node_id] = used_slots.get(alloc.node_id, 0) + alloc.nproc
    return {
        n.pk: NodeView(
            id=n.pk,
            name=n.name,
            takes_work=n.state == NodeState.ONLINE,
            free_slots=n.slots - used_slots.get(n.pk, 0),
            free_gpus=tuple(g for g in gpus[n.pk] if g not in used_gpus.get(n.pk, set())),
            address=n.address or n.hostname or "127.0.0.1",
            recent_ports=frozenset(ports.get(n.pk, ())),
        )
        for n in nodes
    }


def recent_ports() -> dict[int, set[int]]:
    """Each node's ports that listeners held lately: rank 0's store of every round that began
    within PORT_REUSE_AFTER or still lives, and the coordinator, PS and dense stores there."""
    since = timezone.now() - PORT_REUSE_AFTER
    lately = Allocation.objects.filter(Q(round__created_at__gte=since) | Q(pk__in=live_allocations()))
    ports: dict[int, set[int]] = {}
    for node_id, node_rank, master_port, processes in lately.values_list(
        "node_id", "node_rank", "round__master_port", "processes"
    ):
        held = ports.setdefault(node_id, set())
        if node_rank == 0:
            held.add(master_port)
        for row in processes:
            held |= Process.of_row(row).ports()
    return ports


def snapshot(job: Job) -> Snapshot:
    return Snapshot(job_view(job), node_views(exclude_job=job))
