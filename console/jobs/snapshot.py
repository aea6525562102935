"""Reads what planning needs from the database: nodes with their free capacity, a job's view.

The one place that turns rows into console/jobs/plans.py's plain dataclasses, for planning and
for the pages (console/web/nodes.py: why a pending job waits). A node's free capacity is its
slots and GPUs less what the live rounds of the other jobs hold. One decision reads one snapshot
of a job: what it changes later in the same tick is carried forward without reading again
(``Snapshot.after``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db.models import F, Q, QuerySet
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.cluster.network import failed_pairs, recent_check_ports
from console.core.states import AllocationState, JobState, NodeState
from console.jobs.models import Allocation, Job, Round
from console.jobs.plans import Hold, JobView, NodeView, Process, Snapshot

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


def job_view(job: Job, rnd: Round | None = None) -> JobView:
    """``job`` as planning and the pages see it, with its current round (``rnd`` when the
    caller has read it, with its allocations prefetched or not; else read here)."""
    rnd = rnd if rnd is not None else job.current_round()
    allocs = sorted(rnd.allocations.all(), key=lambda a: a.node_rank) if rnd is not None else []
    live = rnd is not None and job.job_state.is_active and rnd.number == job.round_number
    parameter_server = job.is_parameter_server
    return JobView(
        id=job.pk,
        name=job.name,
        min_nodes=job.min_nodes,
        max_nodes=job.max_nodes,
        desired_nodes=job.desired_nodes,
        nproc_per_node=job.nproc_per_node,
        gpus_per_proc=job.gpus_per_proc,
        priority=job.priority,
        members=tuple(a.node_id for a in allocs),
        round_number=rnd.number if rnd is not None else 0,
        round_open=rnd is not None and not rnd.ended,
        round_failed=rnd is not None and rnd.failed,
        round_running=rnd is not None and rnd.round_state.may_carry_over,
        failed_ranks=failed_ranks(rnd, allocs),
        holds=tuple(
            Hold(
                a.node_id,
                0 if job.gpus_per_proc else a.nproc,
                tuple(a.gpu_indices) if job.gpus_per_proc else (),
            )
            for a in allocs
            if live and a.is_live
        ),
        ps_count=job.role_count("ps") if parameter_server else 0,
        workers=job.role_count("worker") if parameter_server else 0,
        hybrid=parameter_server and job.roles.get("ps", {}).get("mode") == "hybrid",
        inplace=job.inplace and not parameter_server,
        processes=tuple(processes_of(a) for a in allocs) if parameter_server else (),
        member_live=tuple(a.is_live for a in allocs),
        selector=selector_of(job),
    )


def labels(values: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset((str(k), str(v)) for k, v in values.items())


def selector_of(job: Job) -> frozenset[tuple[str, str]]:
    """The labels every node of ``job`` must have: its pool's selector and its own."""
    pool = job.pool.selector if job.pool_id and job.pool is not None else {}
    return labels({**pool, **(job.node_selector or {})})


def failed_ranks(rnd: Round | None, allocs: list[Allocation]) -> tuple[int, ...]:
    """The round's failed global ranks (its first failure's rank; any others it reported)."""
    if rnd is None:
        return ()
    ranks = {int(rnd.failure["rank"])} if rnd.failure and "rank" in rnd.failure else set()
    for alloc in allocs:
        for exit in alloc.exit_info.get("exits", []):
            if exit.get("exit_code") not in (0, None) or exit.get("signal"):
                ranks.add(int(exit["rank"]))
    return tuple(sorted(ranks))


def processes_of(alloc: Allocation) -> tuple[Process, ...]:
    """A parameter-server allocation's processes by local rank, each marked ended once its host
    reported its exit."""
    ended = {e.get("local_rank") for e in alloc.exit_info.get("exits", [])}
    return tuple(Process.of_row(row, ended=i in ended) for i, row in enumerate(alloc.processes))


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
            address=n.address or "127.0.0.1",  # never the host name: it may resolve to loopback
            recent_ports=frozenset(ports.get(n.pk, ())),
            labels=labels(n.labels or {}),
        )
        for n in nodes
    }


def recent_ports() -> dict[int, set[int]]:
    """Each node's ports that listeners held lately: rank 0's store of every round that began
    within PORT_REUSE_AFTER or still lives, and the coordinator, PS and dense stores there."""
    since = timezone.now() - PORT_REUSE_AFTER
    lately = Allocation.objects.filter(Q(round__created_at__gte=since) | Q(pk__in=live_allocations()))
    ports: dict[int, set[int]] = recent_check_ports()
    for node_id, node_rank, master_port, processes in lately.values_list(
        "node_id", "node_rank", "round__master_port", "processes"
    ):
        held = ports.setdefault(node_id, set())
        if node_rank == 0:
            held.add(master_port)
        for row in processes:
            held |= Process.of_row(row).ports()
    return ports


def snapshot(job: Job, view: JobView | None = None) -> Snapshot:
    """``job`` (its ``view`` when the caller has built it) and every node, as one decision sees them."""
    return Snapshot(view if view is not None else job_view(job), node_views(exclude_job=job), failed_pairs())
