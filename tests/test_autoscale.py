"""Given an elastic job running on fewer nodes than it wants, when an agent registers a new node,
then the next tick grows the job toward its desired count in an auto-scale round (the members
keep their node ranks, nothing is stopped, no restart used); growth waits while jobs are queued."""

from __future__ import annotations

from console.cluster import registry
from console.core.states import JobState, RoundReason
from console.jobs import scheduler
from console.jobs.models import Job
from tests.support.decisions import TICK, Decide, make_job, make_node, nodes_of, start
from workers import protocol

INFO: protocol.NodeInfo = {
    "hostname": "host-b",
    "address": "10.0.0.9",
    "cpus": 2,
    "memory_bytes": 1 << 30,
    "slots": 2,
    "gpus": [],
    "torch_version": "2.13.0",
    "agent_version": "0.2.0",
    "protocol": protocol.PROTOCOL_VERSION,
}


def test_an_elastic_job_grows_onto_a_node_that_registers(decide: Decide) -> None:
    make_node("a")
    job = make_job("elastic", nnodes="1:2")
    decide(scheduler.tick)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)

    registered = decide(registry.register_node, "b", "session-1", INFO)
    assert registered.sent() == [(protocol.AGENT_SYNC, "node.b", {"rounds": []}), TICK]
    assert registered.kinds() == ["node.registered"]

    grown = decide(scheduler.tick)
    assert grown.sent() == [start(job, 2, "a", 0, 2), start(job, 2, "b", 1, 2)]
    assert grown.kinds() == ["round.autoscale"]
    assert grown.events[0].message == "Round 2: 2 node(s), world size 2 (auto-scale)"
    job.refresh_from_db()
    assert nodes_of(job) == ["a", "b"] and job.restarts == 0
    assert job.current_round().reason == RoundReason.AUTOSCALE  # type: ignore[union-attr]


def test_growth_waits_while_a_job_is_queued(decide: Decide) -> None:
    make_node("a", slots=1)
    job = make_job("elastic", nnodes="1:2")
    decide(scheduler.tick)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    make_job("big", nnodes="2")
    make_node("b", slots=1)

    assert decide(scheduler.tick).sent() == []
    assert nodes_of(job) == ["a"]
