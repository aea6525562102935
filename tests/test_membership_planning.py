"""Membership planning as pure functions: no database, no processes, plain dataclasses in and out.

Placement, node-rank order (rank 0 stays put), GPU assignment, survivors, growth toward the
desired count, preemption victims, and what each reason stops.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from console.core.states import RoundReason
from console.jobs.planning import (
    JobView,
    NodeView,
    Placement,
    Snapshot,
    assign_gpus,
    needs_growth,
    order_members,
    plan_round,
    preemption_victims,
)


def node(pk: int, name: str, slots: int = 2, gpus: tuple[int, ...] = (), takes_work: bool = True) -> NodeView:
    return NodeView(id=pk, name=name, takes_work=takes_work, free_slots=slots, free_gpus=gpus)


def job(nnodes: str = "1", members: tuple[int, ...] = (), inplace: bool = False, **shape: Any) -> JobView:
    low, _, high = nnodes.partition(":")
    return JobView(
        id=7,
        name="j",
        min_nodes=int(low),
        max_nodes=int(high or low),
        desired_nodes=int(high or low),
        members=members,
        inplace=inplace,
        **shape,
    )


def snap(j: JobView, *nodes: NodeView) -> Snapshot:
    return Snapshot(j, {n.id: n for n in nodes})


A, B, C, D = node(1, "a"), node(2, "b"), node(3, "c"), node(4, "d")


def names(plan_nodes: list[int], *nodes: NodeView) -> list[str]:
    by_id = {n.id: n.name for n in nodes}
    return [by_id[pk] for pk in plan_nodes]


# --- placement ----------------------------------------------------------------------------


def test_a_gang_job_is_placed_on_at_least_min_nodes_or_not_at_all() -> None:
    assert plan_round(snap(job("2:3"), A), RoundReason.START) is None
    plan = plan_round(snap(job("2:3"), C, A, B, D), RoundReason.START)
    assert plan is not None and names(plan.node_ids, A, B, C, D) == ["a", "b", "c"]  # by name, up to MAX
    assert plan.placements[0] == Placement(A.id, 0) and not plan.stop and not plan.charged


def test_nodes_that_do_not_take_work_or_lack_room_are_skipped() -> None:
    full = node(5, "e", slots=1)
    away = node(6, "f", takes_work=False)
    plan = plan_round(snap(job("1:3", nproc_per_node=2), full, away, A), RoundReason.START)
    assert plan is not None and plan.node_ids == [A.id]


def test_shortfall_counts_the_fitting_nodes_a_pending_job_still_needs() -> None:
    assert snap(job("3"), A, node(5, "e", slots=0)).shortfall() == 2
    assert snap(job("1"), A).shortfall() == 0


# --- order and GPUs -----------------------------------------------------------------------


def test_nodes_that_stay_keep_their_order_and_newcomers_follow_by_name() -> None:
    ordered = order_members([C.id, A.id], [D, A, B, C])
    assert [n.name for n in ordered] == ["c", "a", "b", "d"]


def test_each_node_rank_gets_the_lowest_free_gpus_of_its_own_node() -> None:
    g1, g2 = node(1, "g1", gpus=(1, 3, 4, 6)), node(2, "g2", gpus=(0, 1))
    placements = assign_gpus(job("2", nproc_per_node=2, gpus_per_proc=1), [g1, g2])
    assert placements == (Placement(1, 0, (1, 3), nproc=2), Placement(2, 1, (0, 1), nproc=2))
    assert g1.free_gpus == (1, 3, 4, 6)  # nothing shared is changed
    assert assign_gpus(job("1"), [g1]) == (Placement(1, 0, ()),)


def test_a_gpu_job_needs_enough_free_gpus_not_slots() -> None:
    short = node(1, "g", slots=8, gpus=(2,))
    assert plan_round(snap(job("1", nproc_per_node=2, gpus_per_proc=1), short), RoundReason.START) is None


# --- survivors and reasons ------------------------------------------------------------------


def test_resize_down_drops_the_highest_node_ranks_and_stops_only_them() -> None:
    j = replace(job("1:3", members=(A.id, B.id, C.id)), desired_nodes=1)
    plan = plan_round(snap(j, A, B, C), RoundReason.RESIZE)
    assert plan is not None and plan.node_ids == [A.id]
    assert plan.stop == (B.id, C.id) and not plan.stop_at_once and not plan.charged


def test_resize_up_adds_free_nodes_by_name_after_the_members() -> None:
    j = replace(job("1:3", members=(B.id,)), desired_nodes=3)
    plan = plan_round(snap(j, D, C, B, A), RoundReason.RESIZE)
    assert plan is not None and names(plan.node_ids, A, B, C, D) == ["b", "a", "c"]
    assert plan.stop == ()


def test_nothing_changes_when_the_job_already_has_its_desired_nodes_or_cannot_keep_min() -> None:
    assert plan_round(snap(job("1:2", members=(A.id, B.id)), A, B), RoundReason.AUTOSCALE) is None
    lone = replace(job("2:3", members=(A.id,)), desired_nodes=3)
    assert plan_round(snap(lone, A), RoundReason.AUTOSCALE) is None


def test_growth_is_wanted_below_the_desired_count() -> None:
    assert needs_growth(job("1:3", members=(A.id,)))
    assert not needs_growth(job("1:3", members=(A.id, B.id, C.id)))


def test_node_loss_keeps_the_survivors_in_order_refills_from_free_nodes_and_kills_the_round() -> None:
    lost = replace(B, takes_work=False)
    j = job("2:3", members=(C.id, B.id, A.id))
    plan = plan_round(snap(j, A, lost, C, D), RoundReason.NODE_LOSS, leaving=B.id)
    assert plan is not None and names(plan.node_ids, A, B, C, D) == ["c", "a", "d"]
    assert plan.stop == (C.id, B.id, A.id) and plan.stop_at_once and not plan.charged


def test_node_loss_leaves_out_a_restarted_node_that_still_takes_work() -> None:
    plan = plan_round(snap(job("1:2", members=(A.id, B.id)), A, B), RoundReason.NODE_LOSS, leaving=B.id)
    assert plan is not None and plan.node_ids == [A.id]


def test_too_few_survivors_send_the_job_back_to_the_queue_stopping_everything_gracefully() -> None:
    plan = plan_round(snap(job("2", members=(A.id, B.id)), A, B), RoundReason.NODE_LOSS, leaving=B.id)
    assert plan is not None and plan.requeue
    assert plan.stop == (A.id, B.id) and not plan.stop_at_once


def test_a_failure_restarts_on_the_nodes_that_take_work_and_is_charged() -> None:
    draining = replace(B, takes_work=False)
    plan = plan_round(snap(job("1:2", members=(A.id, B.id)), A, draining), RoundReason.FAILURE)
    assert plan is not None and plan.node_ids == [A.id] and plan.charged and plan.stop_at_once
    requeue = plan_round(snap(job("2", members=(A.id, B.id)), A, draining), RoundReason.FAILURE)
    assert requeue is not None and requeue.requeue and requeue.charged


def test_a_round_whose_rank_failed_is_stopped_at_once_whatever_replaces_it() -> None:
    j = replace(job("1:2", members=(A.id, B.id)), desired_nodes=1, round_failed=True)
    plan = plan_round(snap(j, A, B), RoundReason.RESIZE)
    assert plan is not None and plan.stop == (A.id, B.id) and plan.stop_at_once


def test_a_drain_moves_only_elastic_jobs_that_keep_their_min() -> None:
    draining = replace(B, takes_work=False)
    plan = plan_round(snap(job("1:2", members=(A.id, B.id)), A, draining), RoundReason.DRAIN, leaving=B.id)
    assert plan is not None and plan.node_ids == [A.id] and plan.stop == (B.id,) and not plan.stop_at_once
    assert (
        plan_round(snap(job("2", members=(A.id, B.id)), A, draining), RoundReason.DRAIN, leaving=B.id) is None
    )


def test_restart_keeps_every_member_in_place() -> None:
    plan = plan_round(snap(job("2", members=(B.id, A.id)), A, B), RoundReason.RESTART)
    assert plan is not None and plan.node_ids == [B.id, A.id] and plan.stop == () and not plan.charged
    assert plan_round(snap(job("1"), A), RoundReason.RESTART) is None


# --- preemption ----------------------------------------------------------------------------


def test_preemption_shrinks_lower_priority_jobs_toward_min_lowest_priority_first() -> None:
    urgent = job("2", priority=5)
    low = replace(job("1:3", members=(1, 2, 3)), id=10, priority=0)
    lower = replace(job("2:3", members=(4, 5, 6)), id=11, priority=-1)
    rigid = replace(job("2", members=(7, 8)), id=12, priority=-2)
    peer = replace(job("1:3", members=(9, 13)), id=13, priority=5)
    assert preemption_victims(urgent, 2, [rigid, lower, low, peer]) == [(11, 2), (10, 2)]
    assert preemption_victims(urgent, 1, [peer]) == []


def test_a_preemption_plan_keeps_the_lowest_node_ranks() -> None:
    plan = plan_round(snap(job("1:3", members=(C.id, A.id, B.id)), A, B, C), RoundReason.PREEMPTION, target=1)
    assert plan is not None and plan.node_ids == [C.id] and plan.stop == (A.id, B.id)


# --- in-place rounds (sdk.elastic jobs) -------------------------------------------------------


def test_an_inplace_resize_up_carries_every_member_rank_over_unchanged() -> None:
    j = replace(job("1:3", members=(A.id, B.id), inplace=True, nproc_per_node=2), desired_nodes=3)
    plan = plan_round(snap(j, A, B, C), RoundReason.RESIZE)
    assert plan is not None and plan.inplace and plan.stop == ()
    assert plan.carry_over == ((0, 0), (1, 1), (2, 2), (3, 3))  # C's ranks 4, 5 start afresh


def test_an_inplace_drain_moves_the_ranks_after_the_leaving_node_down() -> None:
    j = job("1:3", members=(A.id, B.id, C.id), inplace=True, nproc_per_node=2)
    draining = replace(A, takes_work=False)
    plan = plan_round(snap(j, draining, B, C), RoundReason.DRAIN, leaving=A.id)
    assert plan is not None and plan.stop == (A.id,)
    assert plan.carry_over == ((2, 0), (3, 1), (4, 2), (5, 3))


def test_lost_nodes_failures_and_jobs_without_the_sdk_restart_afresh() -> None:
    j = job("1:3", members=(A.id, B.id, C.id), inplace=True)
    for reason, leaving in ((RoundReason.NODE_LOSS, C.id), (RoundReason.FAILURE, None)):
        plan = plan_round(snap(j, A, B, replace(C, takes_work=False)), reason, leaving=leaving)
        assert plan is not None and not plan.inplace
    plain = replace(job("1:3", members=(A.id, B.id)), desired_nodes=3)
    assert not (plan := plan_round(snap(plain, A, B, C), RoundReason.RESIZE)) or not plan.inplace
    grown = replace(j, members=(A.id, B.id), round_running=False)
    stopped = plan_round(snap(grown, A, B, C), RoundReason.AUTOSCALE)
    assert stopped is not None and not stopped.inplace


def test_a_fallback_restarts_every_member_at_once_uncharged() -> None:
    j = job("1:3", members=(A.id, B.id), inplace=True)
    plan = plan_round(snap(j, A, B), RoundReason.FALLBACK)
    assert plan is not None and plan.node_ids == [A.id, B.id] and plan.stop == (A.id, B.id)
    assert plan.stop_at_once and not plan.charged and not plan.inplace
