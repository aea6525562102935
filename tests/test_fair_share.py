"""Quotas, borrowing, fair share and reclaim as pure decisions (console/teams/fairshare.py,
console/teams/reclaim.py): no database, no processes."""

from __future__ import annotations

from console.teams.fairshare import Ask, FairQueue, Ledger, PoolView, QuotaView, Why
from console.teams.reclaim import Holder, reclaim

POOL = "a100"


def ledger(used: dict[str, int], quotas: dict[str, QuotaView], capacity: int = 16, **weights: int) -> Ledger:
    return Ledger(
        [PoolView(POOL, capacity, quotas)],
        {(ws, POOL): units for ws, units in used.items()},
        {ws: weights.get(ws, 1) for ws in quotas},
    )


def ask(job_id: int, workspace: str, units: int, priority: int = 0, pool: str = POOL) -> Ask:
    return Ask(job_id, workspace, pool, units, priority, order=job_id, name=f"j{job_id}")


def test_within_quota_borrowing_over_quota_and_pool_full() -> None:
    book = ledger(
        {"red": 6, "blue": 6},
        {"red": QuotaView(8, borrowing_limit=2), "blue": QuotaView(8, borrowing_limit=None)},
    )
    assert book.check(ask(1, "red", 2)).why is Why.WITHIN_QUOTA
    assert book.check(ask(2, "red", 4)).why is Why.BORROWING  # 10 of 8, limit 2
    over = book.check(ask(3, "red", 5))  # 11: 3 over, limit 2
    assert over.why is Why.OVER_QUOTA and not over.admissible
    assert "its quota is 8 and it may borrow 2 more" in over.message
    assert book.check(ask(4, "blue", 4)).why is Why.BORROWING  # 4 idle in the pool
    full = book.check(ask(5, "blue", 5))
    assert full.why is Why.POOL_FULL and "4 idle" in full.message


def test_a_workspace_without_a_quota_in_an_enforced_pool_may_only_borrow() -> None:
    book = ledger({}, {"red": QuotaView(8)})
    verdict = book.check(ask(1, "green", 2))
    assert verdict.why is Why.BORROWING and not verdict.reclaims


def test_a_pool_without_quotas_is_strict_priority_order_and_one_blocked_job_holds_the_rest() -> None:
    book = Ledger([], {}, {})
    queue = FairQueue(
        book, [ask(1, "red", 1, pool=""), ask(2, "blue", 1, 5, pool=""), ask(3, "red", 1, pool="")]
    )
    first = next(queue)
    assert first.job_id == 2
    queue.blocked()
    assert list(queue) == []
    assert queue.behind == {1: first, 3: first}


def test_borrowers_take_turns_by_dominant_share_over_weight() -> None:
    # Given two workspaces with no quota in a 12-GPU pool (both only borrow), weights 2 and 1,
    # and a long queue of 1-GPU jobs from each
    book = ledger({}, {"big": QuotaView(0), "small": QuotaView(0)}, capacity=12, big=2, small=1)
    asks = [ask(i, "big", 1) for i in range(100, 120)] + [ask(i, "small", 1) for i in range(200, 220)]
    queue = FairQueue(book, asks)
    placed = []
    for job in queue:
        if book.check(job).admissible:
            placed.append(job.workspace)
            queue.placed(job)
        else:
            queue.blocked()
    # Then the pool is shared 2:1 by weight
    assert placed.count("big") == 8 and placed.count("small") == 4


def test_jobs_within_quota_go_before_borrowers() -> None:
    book = ledger({"red": 10, "blue": 0}, {"red": QuotaView(8), "blue": QuotaView(8)})
    queue = FairQueue(book, [ask(1, "red", 1, priority=100), ask(2, "blue", 1)])
    assert next(queue).job_id == 2  # blue is within its quota; red borrows, whatever its priority


def test_reclaim_shrinks_elastic_borrowers_before_preempting_anyone() -> None:
    # red borrows 8 over its quota of 4: an elastic 2..6-node job and a rigid 2-node job (1 GPU a node)
    book = ledger({"red": 12, "blue": 0}, {"red": QuotaView(4), "blue": QuotaView(8)}, capacity=12)
    holders = [
        Holder(1, "red", POOL, nodes=6, min_nodes=2, units_per_node=1, order=1),
        Holder(2, "red", POOL, nodes=2, min_nodes=2, units_per_node=1, order=2),
        Holder(3, "red", POOL, nodes=4, min_nodes=4, units_per_node=1, order=3),
    ]
    gives = reclaim(book, "blue", POOL, 3, holders)
    assert [(g.job_id, g.keep, g.preempts) for g in gives] == [(1, 3, False)]

    gives = reclaim(book, "blue", POOL, 6, holders)
    # the elastic job gives its 4 spare nodes, then the newest rigid job is preempted whole
    assert [(g.job_id, g.keep, g.preempts) for g in gives] == [(1, 2, False), (3, 0, True)]

    no_shrink = reclaim(book, "blue", POOL, 3, holders, shrink=False)
    assert [g.preempts for g in no_shrink] == [True]


def test_reclaim_takes_nothing_from_workspaces_within_their_quota_or_when_it_cannot_free_enough() -> None:
    book = ledger({"red": 4, "blue": 4}, {"red": QuotaView(4), "blue": QuotaView(8)}, capacity=8)
    holders = [Holder(1, "red", POOL, nodes=4, min_nodes=1, units_per_node=1)]
    assert reclaim(book, "blue", POOL, 2, holders) == []  # red borrows nothing
    book = ledger({"red": 6, "blue": 2}, {"red": QuotaView(4), "blue": QuotaView(4)}, capacity=8)
    holders = [Holder(1, "red", POOL, nodes=6, min_nodes=5, units_per_node=1)]
    assert reclaim(book, "blue", POOL, 3, holders, shrink=True)[0].job_id == 1
    # never more than red borrows by shrinking: 2 nodes; then preempting it frees the rest
    assert [(g.keep, g.units) for g in reclaim(book, "blue", POOL, 3, holders)] == [(0, 6)]
