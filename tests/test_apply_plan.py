"""Applying a plan (console/jobs/rounds.py's apply_plan) decides nothing: a Plan written by hand,
ports and processes included, becomes exactly those rows, then exactly these events, then exactly
these commands (stops before starts), whatever a planner would have chosen. A parameter-server
round goes the same way, and so does a parameter-server round's worker change in place
(apply_workers)."""

from __future__ import annotations

from typing import Any

from console.cluster.models import Node
from console.core.decision import decision
from console.core.states import JobState, RoundPhase, RoundReason
from console.jobs.models import Job, Round
from console.jobs.planning import Placement, Plan, Process, WorkerPlan
from console.jobs.rounds import apply_plan, apply_workers, finish_job
from tests.support.decisions import Decide, make_job, make_node, start, stop
from workers import protocol


def apply(job: Job, plan: Plan) -> None:
    with decision():
        apply_plan(Job.lock(job.pk), plan)


def test_a_hand_made_plan_becomes_exactly_its_round_then_its_events_then_its_commands(decide: Decide) -> None:
    a, b, c = make_node("a"), make_node("b"), make_node("c")
    job = make_job("j", nnodes="1:3")
    first = Plan(
        reason=RoundReason.START,
        placements=(Placement(b.pk, 0), Placement(a.pk, 1)),
        stop=(),
        stop_at_once=False,
        charged=False,
        master_addr="10.9.9.9",
        master_port=24680,
    )
    started = decide(apply, job, first)
    rnd = Round.objects.get(job=job, number=1)
    assert (rnd.master_addr, rnd.master_port, rnd.world_size, rnd.state) == ("10.9.9.9", 24680, 2, "starting")
    assert [(x.node.name, x.node_rank) for x in rnd.allocations.order_by("node_rank")] == [("b", 0), ("a", 1)]
    assert started.kinds() == ["round.start"]
    assert started.sent() == [
        start(job, 1, "b", 0, 2, master_addr="10.9.9.9"),
        start(job, 1, "a", 1, 2, master_addr="10.9.9.9"),
    ]

    # A failure plan (charged, stops at once, in place on two of the nodes): the same straight line
    second = Plan(
        reason=RoundReason.FAILURE,
        placements=(Placement(b.pk, 0), Placement(c.pk, 1)),
        stop=(b.pk, a.pk),
        stop_at_once=True,
        charged=True,
        carry_over=((0, 0),),
        carry_from=1,
        master_addr="10.9.9.9",
        master_port=24682,
    )
    replaced = decide(apply, job, second)
    carry = {"carry_over": {"from_round": 1, "ranks": {"0": 0}}}
    assert replaced.kinds() == ["round.failure"]
    assert replaced.sent() == [
        stop(job, 1, "b", 0.0),
        stop(job, 1, "a", 0.0),
        start(job, 2, "b", 0, 2, master_addr="10.9.9.9", **carry),
        start(job, 2, "c", 1, 2, master_addr="10.9.9.9", **carry),
    ]
    job.refresh_from_db()
    assert (job.state, job.restarts, job.round_number) == (JobState.RESTARTING, 1, 2)
    assert list(job.rounds.values_list("number", "state", "outcome", "inplace")) == [
        (1, RoundPhase.ENDED, "replaced", False),
        (2, RoundPhase.FORMING, None, True),
    ]

    # Back to the queue: the round ends requeued, its ranks stop gracefully, nothing starts
    requeue = Plan(RoundReason.NODE_LOSS, placements=(), stop=(b.pk, c.pk), stop_at_once=False, charged=False)
    queued = decide(apply, job, requeue)
    assert queued.sent() == [stop(job, 2, "b", 12.0), stop(job, 2, "c", 12.0)]
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.rounds.get(number=2).outcome == "requeued"


def hybrid_plan() -> tuple[Job, Node, Node, Plan, dict[str, Any]]:
    """A hybrid parameter-server job on nodes a and b and the plan of its first round."""
    a, b = make_node("a", slots=3), make_node("b", slots=3)
    job = make_job("ps")
    Job.objects.filter(pk=job.pk).update(
        strategy="parameter_server", roles={"ps": {"count": 1, "mode": "hybrid"}, "worker": {"count": 2}}
    )
    job.refresh_from_db()
    dense: dict[str, Any] = {"dense_world": 2, "dense_master": "10.0.0.2:27001"}
    plan = Plan(
        reason=RoundReason.START,
        placements=(
            Placement(
                a.pk,
                0,
                processes=(
                    Process("coordinator", 0, 0, port=25001),
                    Process("worker", 1, 3, dense_rank=1, **dense),
                ),
                nproc=2,
            ),
            Placement(
                b.pk,
                1,
                processes=(Process("ps", 0, 1, port=25002), Process("worker", 0, 2, dense_rank=0, **dense)),
                nproc=2,
            ),
        ),
        stop=(),
        stop_at_once=False,
        charged=False,
        master_addr=a.address,
        master_port=25001,
    )
    return job, a, b, plan, dense


def test_a_parameter_server_plan_keeps_its_ports_and_dense_group(decide: Decide) -> None:
    job, a, b, plan, dense = hybrid_plan()
    started = decide(apply, job, plan)
    rnd = job.rounds.get()
    assert (rnd.master_port, rnd.world_size) == (25001, 4)
    rows = {x.node.name: x.processes for x in rnd.allocations.all()}
    assert rows["b"] == [
        {"role": "ps", "index": 0, "rank": 1, "port": 25002},
        {"role": "worker", "index": 0, "rank": 2, "dense_rank": 0, **dense},
    ]
    specs: dict[str, Any] = {queue: kwargs["spec"] for _, queue, kwargs in started.to_agents()}
    assert [name for name, _, _ in started.to_agents()] == [protocol.AGENT_START_ROUND] * 2
    assert specs["node.a"]["ps"]["coordinator"] == f"{a.address}:25001"
    assert specs["node.a"]["ps"]["addresses"] == [f"{b.address}:25002"]
    assert specs["node.a"]["ps"]["processes"][1] == {
        "role": "worker",
        "index": 1,
        "rank": 3,
        "dense_rank": 1,
        **dense,
    }

    # And ending the job stops both hosts (its PS serve until told), after its event
    ended = decide(lambda: finish_job(Job.lock(job.pk), JobState.SUCCEEDED, "done"))
    assert ended.kinds() == ["job.succeeded"]
    assert ended.to_agents() == [stop(job, 1, "a", 12.0), stop(job, 1, "b", 12.0)]
    assert job.rounds.get().outcome == "succeeded"


def test_a_worker_change_in_place_is_written_as_given_then_its_event_then_the_changed_host(
    decide: Decide,
) -> None:
    # Given a hybrid job's running round
    job, a, b, plan, dense = hybrid_plan()
    decide(apply, job, plan)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    # When a hand-made worker change (charged: its group broke) is applied
    group: dict[str, Any] = {"dense_world": 1, "dense_master": "10.0.0.1:27555"}
    change = WorkerPlan(
        reason=RoundReason.FAILURE,
        round_number=1,
        workers=1,
        placements=(
            Placement(
                a.pk,
                0,
                processes=(
                    Process("coordinator", 0, 0, port=25001),
                    Process("worker", 1, 3, dense_rank=1, removed=True, **dense),
                    Process("worker", 2, 4, dense_rank=0, joined="replacement", **group),
                ),
                nproc=2,
            ),
            Placement(b.pk, 1, processes=(Process("ps", 0, 1, port=25002),), nproc=1),
        ),
        changed=(a.pk,),
        added=(2,),
        removed=(0, 1),
        charged=True,
        hybrid=True,
        lost=1,
    )
    regrouped = decide(lambda: apply_workers(Job.lock(job.pk), change))
    # Then its rows are exactly the plan's, then its event, then the round to the changed host only
    job.refresh_from_db()
    rnd = job.rounds.get()
    assert job.restarts == 1 and rnd.world_size == 3
    assert [x.processes for x in rnd.allocations.order_by("node_rank")] == [
        [p.row() for p in place.processes] for place in change.placements
    ]
    assert regrouped.kinds() == ["ps.worker_group_replaced"]
    assert regrouped.events[0].message.startswith(
        "Hybrid job: worker 1 failed (restart 1 of 3); worker(s) [0, 1]"
    )
    ((name, queue, kwargs),) = regrouped.to_agents()
    assert (name, queue, kwargs["spec"]["round"]) == (protocol.AGENT_START_ROUND, "node.a", 1)
    assert kwargs["spec"]["ps"]["processes"][2] == {
        "role": "worker",
        "index": 2,
        "rank": 4,
        "dense_rank": 0,
        **group,
    }
    assert kwargs["spec"]["ps"]["processes"][1]["removed"] is True
