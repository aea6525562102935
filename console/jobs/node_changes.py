"""What a node's news means for the jobs on it: the receivers of console/cluster/hooks.py, and
the tick's pass that moves jobs off draining nodes.

cluster says what happened to a node (lost, offline, restarted, registered, a heartbeat); this
module decides what that does to the rounds placed there, through the same entry as every other
membership change (``change_membership``). Connected in ``JobsConfig.ready``.
"""

from __future__ import annotations

from console.cluster import hooks
from console.cluster.models import Node
from console.cluster.watch import mark_drained
from console.core.decision import decision
from console.core.states import NodeState, RoundReason
from console.core.transport import send_on_commit
from console.jobs.failures import refund_failures_caused_by
from console.jobs.membership import change_membership
from console.jobs.models import Job
from console.jobs.reports import apply_round_statuses
from console.jobs.snapshot import live_allocations
from console.jobs.spec import round_spec
from workers import protocol


def move_off_gone_node(news: hooks.NodeGone) -> None:
    """Every active job with a live allocation on the node gets a round without it (or waits).
    Failures its peers reported since ``last_seen`` are refunded: they were the node's loss.
    The caller (cluster) holds decision()."""
    for alloc in live_allocations().filter(node=news.node).select_related("round"):
        job = Job.lock(alloc.round.job_id)
        if job.round_number != alloc.round.number or not job.job_state.is_active:
            continue
        refund_failures_caused_by(job, news.node, news.last_seen)
        change_membership(job, RoundReason.NODE_LOSS, leaving=news.node, how=news.how)


def sync_node(news: hooks.NodeUp) -> None:
    """Tell the agent every round it should be running now (it stops the rest)."""
    specs = [
        round_spec(a.round.job, a.round, a)
        for a in live_allocations().filter(node=news.node).select_related("round__job__bundle")
    ]
    send_on_commit(protocol.AGENT_SYNC, news.node.queue, rounds=specs)


def apply_heartbeat_rounds(news: hooks.RoundsReported) -> None:
    apply_round_statuses(news.node, news.rounds)


def progress_drains() -> None:
    """The tick's pass: move elastic jobs off DRAINING nodes; a node with nothing left on it is
    DRAINED."""
    for pk in list(Node.objects.filter(state=NodeState.DRAINING).values_list("pk", flat=True)):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            if node.state != NodeState.DRAINING:
                continue
            for alloc in list(live_allocations().filter(node=node).select_related("round")):
                change_membership(Job.lock(alloc.round.job_id), RoundReason.DRAIN, leaving=node)
            if not live_allocations().filter(node=node).exists():
                mark_drained(node)


def connect() -> None:
    hooks.node_gone.connect(move_off_gone_node)
    hooks.node_up.connect(sync_node)
    hooks.rounds_reported.connect(apply_heartbeat_rounds)
