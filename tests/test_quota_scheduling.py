"""Given node pools with quotas, when the controller ticks, then: a workspace borrows idle quota;
a workspace over its quota waits with the reason stored; a workspace that needs its quota back
reclaims it by shrinking the borrower's elastic job first (an event names who reclaimed), and
preempts (a graceful stop, so the script checkpoints, then back to the queue) only when
shrinking is not enough; placement honours the pool's labels. Real PostgreSQL, in-process ticks."""

from __future__ import annotations

from console.core.states import JobState, RoundReason
from console.jobs import scheduler
from console.jobs.models import Job
from console.teams.models import NodePool, Quota, Resource, Workspace
from tests.support.decisions import Decide, make_job, make_node, nodes_of, stop


def pool_with_quotas(red: int, blue: int, limit: int | None = None) -> tuple[Workspace, Workspace]:
    pool = NodePool.objects.create(name="cpu", selector={"kind": "cpu"}, resource=Resource.CPU)
    teams = []
    for name, nominal in (("red", red), ("blue", blue)):
        workspace = Workspace.objects.create(name=name)
        Quota.objects.create(workspace=workspace, pool=pool, nominal=nominal, borrowing_limit=limit)
        teams.append(workspace)
    return teams[0], teams[1]


def job_in(workspace: Workspace, name: str, nnodes: str) -> Job:
    job = make_job(name, nnodes=nnodes)
    Job.objects.filter(pk=job.pk).update(workspace=workspace, pool=NodePool.objects.get(name="cpu"))
    return Job.objects.get(pk=job.pk)


def nodes(count: int) -> None:
    for index in range(count):
        node = make_node(f"n{index}", slots=1)
        node.labels = {"kind": "cpu"}
        node.save()


def running(*jobs: Job) -> None:
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state=JobState.RUNNING)


def test_a_workspace_borrows_idle_quota_and_over_its_limit_waits_with_the_reason(decide: Decide) -> None:
    nodes(4)
    red, _ = pool_with_quotas(red=2, blue=2, limit=1)
    first = job_in(red, "first", "2")
    second = job_in(red, "second", "1")  # borrows 1: within its limit
    third = job_in(red, "third", "1")  # would borrow 2: over the limit

    decide(scheduler.tick)

    assert nodes_of(first) == ["n0", "n1"] and nodes_of(second) == ["n2"]
    third.refresh_from_db()
    assert third.state == JobState.PENDING
    assert third.wait_reason == (
        "Over quota: red would use 4 in pool cpu, its quota is 2 and it may borrow 1 more"
    )


def test_reclaim_shrinks_the_borrowers_elastic_job_first(decide: Decide) -> None:
    nodes(4)
    red, blue = pool_with_quotas(red=2, blue=2)
    wide = job_in(red, "wide", "1:4")
    decide(scheduler.tick)
    running(wide)
    assert nodes_of(wide) == ["n0", "n1", "n2", "n3"]  # red borrows blue's idle 2

    mine = job_in(blue, "mine", "2")
    reclaimed = decide(scheduler.tick)

    assert nodes_of(wide) == ["n0", "n1"] and nodes_of(mine) == ["n2", "n3"]
    assert reclaimed.kinds() == ["job.shrunk", "round.preemption", "round.start"]
    shrunk = reclaimed.events[0]
    assert shrunk.job_id == wide.pk and shrunk.data["workspace"] == "blue"
    assert shrunk.message == "Shrinking to 2 node(s): workspace blue reclaims its quota for job mine"
    assert stop(wide, 1, "n2", 12.0) in reclaimed.sent() and stop(wide, 1, "n3", 12.0) in reclaimed.sent()
    wide.refresh_from_db()
    assert wide.restarts == 0 and wide.current_round().reason == RoundReason.PREEMPTION  # type: ignore[union-attr]


def test_reclaim_preempts_gracefully_when_shrinking_is_not_enough(decide: Decide) -> None:
    nodes(4)
    red, blue = pool_with_quotas(red=1, blue=3)
    elastic = job_in(red, "elastic", "1:2")
    rigid = job_in(red, "rigid", "2")
    decide(scheduler.tick)
    running(elastic, rigid)
    assert len(nodes_of(elastic)) == 2 and len(nodes_of(rigid)) == 2  # red borrows 3

    mine = job_in(blue, "mine", "3")
    reclaimed = decide(scheduler.tick)

    # The elastic job shrinks by one; the rigid one is preempted whole: its ranks get the job's
    # grace period (SIGTERM: the SDK checkpoints) and it goes back to the queue.
    assert reclaimed.kinds()[:2] == ["job.shrunk", "round.preemption"]
    preempted = next(e for e in reclaimed.events if e.kind == "job.preempted")
    assert preempted.job_id == rigid.pk and preempted.data["workspace"] == "blue"
    assert "stopped gracefully to checkpoint" in preempted.message
    rigid_stops = [s for s in reclaimed.sent() if s[2].get("job_id") == rigid.pk]
    assert len(rigid_stops) == 2 and all(s[2]["grace_period"] == 12.0 for s in rigid_stops)
    rigid.refresh_from_db()
    assert rigid.state == JobState.PENDING and rigid.restarts == 0
    assert len(nodes_of(mine)) == 3 and len(nodes_of(elastic)) == 1


def test_with_shrinking_off_the_same_reclaim_preempts(decide: Decide) -> None:
    nodes(4)
    red, blue = pool_with_quotas(red=2, blue=2)
    wide = job_in(red, "wide", "1:4")
    decide(scheduler.tick)
    running(wide)
    job_in(blue, "mine", "2")

    reclaimed = decide(scheduler.schedule, shrink=False)

    assert "job.preempted" in reclaimed.kinds() and "job.shrunk" not in reclaimed.kinds()


def test_a_pool_places_only_on_nodes_with_its_labels(decide: Decide) -> None:
    make_node("plain", slots=4)
    labelled = make_node("tagged", slots=4)
    labelled.labels = {"kind": "cpu", "zone": "b"}
    labelled.save()
    red, _ = pool_with_quotas(red=8, blue=0)
    job = job_in(red, "placed", "1")
    picky = job_in(red, "picky", "1")
    Job.objects.filter(pk=picky.pk).update(node_selector={"zone": "c"})

    decide(scheduler.tick)

    assert nodes_of(job) == ["tagged"]
    picky.refresh_from_db()
    assert picky.state == JobState.PENDING
    assert picky.wait_reason.startswith(
        "Pool full in pool cpu: needs 1 node(s) with 1 free slot(s), kind=cpu, zone=c"
    )
