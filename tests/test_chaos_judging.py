"""How bench/chaos judges a run from the script's own step log: a step sequence that goes back
more than one checkpoint interval, skips ahead or mixes two processes is caught, and points are
counted lost or duplicated per (round, rank, step). In-process, no services."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.chaos.measure import check_sequence, compare_points, logged_steps

EVERY = 10


def start(pid: int, resume: int, t: float, round_: int = 1) -> dict[str, Any]:
    return {"event": "start", "t": t, "pid": pid, "resume_step": resume, "round": round_, "rank": 0}


def steps(pid: int, first: int, last: int, t: float, round_: int = 1) -> list[dict[str, Any]]:
    return [
        {"t": t + i * 0.01, "pid": pid, "step": step, "round": round_, "rank": 0}
        for i, step in enumerate(range(first, last + 1))
    ]


def test_a_resume_from_the_last_snapshot_is_clean() -> None:
    # Given a process killed at step 27 and one resumed from the snapshot of step 20
    log = [start(1, 0, 0.0), *steps(1, 1, 27, 0.1), start(2, 20, 5.0, 2), *steps(2, 21, 40, 5.1, 2)]

    # When the sequence is checked
    sequence = check_sequence(log, EVERY)

    # Then it is clean and seven steps were redone
    assert sequence.problems == []
    assert [r.redone for r in sequence.resumes] == [0, 7]
    assert sequence.highest == 40


def test_going_back_more_than_one_interval_is_caught() -> None:
    # Given a process that resumed from step 10 after step 27 had been trained (and 20 saved)
    log = [start(1, 0, 0.0), *steps(1, 1, 27, 0.1), start(2, 10, 5.0, 2), *steps(2, 11, 15, 5.1, 2)]

    problems = check_sequence(log, EVERY).problems

    assert [p.text for p in problems] == ["pid 2 resumed at step 10, more than 10 behind step 27"]
    assert problems[0].t == 5.0


def test_skipping_ahead_is_caught() -> None:
    # Given a process that resumed ahead of every step logged, and a step missing within a process
    log = [start(1, 0, 0.0), *steps(1, 1, 5, 0.1), start(2, 9, 1.0, 2), *steps(2, 10, 12, 1.1, 2)]
    log += steps(2, 14, 14, 2.0, 2)

    texts = [p.text for p in check_sequence(log, EVERY).problems]

    assert texts == ["pid 2 resumed at step 9, ahead of step 5", "pid 2 logged step 14 after step 12"]


def test_an_old_process_still_logging_after_a_new_one_started_is_caught() -> None:
    # Given the old round's rank 0 appending a step after the new round's rank 0 started
    log = [start(1, 0, 0.0), *steps(1, 1, 12, 0.1), start(2, 10, 3.0, 2), *steps(1, 13, 13, 3.1)]
    log += steps(2, 11, 14, 3.2, 2)

    texts = [p.text for p in check_sequence(log, EVERY).problems]

    assert texts == ["step 13 logged by pid 1 (round 1) while pid 2 trains"]


def test_points_are_lost_or_duplicated_per_round_rank_and_step() -> None:
    # Given two ranks' logs and what the database stored
    logs = [steps(1, 1, 3, 0.0), [{**r, "rank": 1} for r in steps(2, 1, 3, 0.0)]]
    expected = logged_steps(logs)
    stored = Counter({(1, 0, 1): 1, (1, 0, 2): 2, (1, 0, 3): 1, (1, 1, 1): 1, (1, 1, 3): 1, (1, 1, 9): 1})

    # When they are compared
    count = compare_points(expected, stored)

    # Then rank 1's step 2 is lost, rank 0's step 2 is stored twice, and step 9 was never logged
    assert (count.expected, count.lost, count.duplicated, count.unlogged) == (6, 1, 1, 1)
    assert count.lost_keys == ((1, 1, 2),)


def test_ranks_that_resumed_from_different_snapshots_are_caught() -> None:
    # Given a new rank 0 whose peers resumed from an older snapshot than it did
    log = [start(1, 0, 0.0), *steps(1, 1, 25, 0.1), {**start(2, 20, 3.0, 2), "ranks_resume": [20, 10, 20]}]

    texts = [p.text for p in check_sequence(log, EVERY).problems]

    assert texts == ["pid 2: the ranks resumed from different steps [20, 10, 20]"]
