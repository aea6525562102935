"""An agent restart is not the job's fault. Given a job running on a and b, when b's agent comes
back under a new session (it lost its ranks), then the job gets a node-loss round without b that
uses up no restart, also when the peers' rank failures that b's restart caused were reported
first, and even when one of them was already charged."""

from __future__ import annotations

from console.cluster import registry
from console.core.states import JobState, RoundReason
from console.jobs import reports, scheduler
from console.jobs.models import Job
from tests.support.decisions import TICK, Decide, failing_exit, make_job, make_node, nodes_of, start, stop
from workers import protocol

INFO: protocol.NodeInfo = {
    "hostname": "host-b",
    "address": "10.0.0.2",
    "cpus": 2,
    "memory_bytes": 1 << 30,
    "slots": 2,
    "gpus": [],
    "torch_version": "2.13.0",
    "agent_version": "0.2.0",
    "protocol": protocol.PROTOCOL_VERSION,
}
LOAD: protocol.NodeLoad = {"cpu_percent": 10.0, "memory_percent": 20.0, "gpus": []}


def running_job(decide: Decide, nnodes: str = "1:2") -> Job:
    make_node("a"), make_node("b")
    job = make_job("elastic", nnodes=nnodes)
    decide(scheduler.tick)
    return job


def test_a_restarted_agent_gets_a_node_loss_round_without_its_node(decide: Decide) -> None:
    job = running_job(decide)

    restarted = decide(registry.register_node, "b", "session-new", INFO)

    assert restarted.sent() == [
        stop(job, 1, "a", 0.0),
        stop(job, 1, "b", 0.0),
        start(job, 2, "a", 0, 1),
        (protocol.AGENT_SYNC, "node.b", {"rounds": []}),
        TICK,
    ]
    assert restarted.kinds() == ["node.restarted", "job.node_lost", "round.node_loss"]
    assert restarted.events[1].message == "Node b restarted; continuing on 1 node(s)"
    job.refresh_from_db()
    assert nodes_of(job) == ["a"] and job.restarts == 0


def test_peer_failures_reported_before_the_agent_registers_again_are_not_charged(decide: Decide) -> None:
    job = running_job(decide)
    # b's ranks died with its agent; a's rank fails in its collective and says so first
    decide(reports.rank_exited, "a", job.pk, 1, failing_exit(rank=0, code=1))
    assert decide(scheduler.tick).sent() == []  # b has not been heard from: not settled

    decide(registry.register_node, "b", "session-new", INFO)

    job.refresh_from_db()
    assert job.restarts == 0 and job.current_round().reason == RoundReason.NODE_LOSS  # type: ignore[union-attr]
    assert list(job.rounds.values_list("state", "outcome", "charged")) == [
        ("ended", "failed", False),
        ("starting", None, False),
    ]


def test_a_failure_charged_on_the_old_agents_last_heartbeat_is_refunded(decide: Decide) -> None:
    job = running_job(decide, nnodes="2")
    decide(reports.rank_exited, "a", job.pk, 1, failing_exit(rank=0, code=1))
    # The dead agent's last heartbeat, sent before it died, is processed after the failure
    registry.heartbeat("b", "session-b", LOAD, [])
    decide(scheduler.tick)
    job.refresh_from_db()
    assert job.restarts == 1 and job.current_round().reason == RoundReason.FAILURE  # type: ignore[union-attr]

    requeued = decide(registry.register_node, "b", "session-new", INFO)

    job.refresh_from_db()
    assert job.restarts == 0 and not job.rounds.filter(charged=True).exists()
    assert job.state == JobState.PENDING  # a 2-node job with one node left waits, then resumes
    assert "job.pending" in requeued.kinds()
    resumed = decide(scheduler.tick)
    assert resumed.kinds() == ["round.resume"] and nodes_of(job) == ["a", "b"]
