"""Goodput on scripted timelines (console/telemetry/goodput.py, no database): each bucket gets the
seconds the timeline says, and every second of the wall time is in exactly one bucket."""

from __future__ import annotations

import pytest

from console.telemetry.goodput import BUCKETS, Goodput, Hang, RoundFacts, Timeline, combine, compute


def stepping(
    number: int, reason: str, created: float, first: tuple[int, float], last: tuple[int, float], **kw: object
) -> RoundFacts:
    return RoundFacts(
        number=number,
        reason=reason,
        created=created,
        first_step=first[0],
        first_step_time=first[1],
        last_step=last[0],
        last_step_time=last[1],
        **kw,  # type: ignore[arg-type]
    )


def assert_adds_up(result: Goodput) -> dict[str, float]:
    totals = result.totals()
    assert set(totals) == set(BUCKETS)
    assert sum(totals.values()) == pytest.approx(result.wall)
    return totals


def test_a_job_that_queued_started_trained_and_ended() -> None:
    # Given: submitted at 0, placed at 10, first step (1 s/step) logged at 15, step 100 at 114,
    # finished at 116.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=116,
        rounds=(stepping(1, "start", 10, (1, 15), (100, 114), ended=116, outcome="succeeded"),),
    )
    # When
    totals = assert_adds_up(compute(timeline))
    # Then: the first step began one step before it was logged.
    assert totals["queued"] == pytest.approx(10)
    assert totals["starting"] == pytest.approx(4)
    assert totals["productive"] == pytest.approx(100)
    assert totals["ending"] == pytest.approx(2)
    assert compute(timeline).ratio == pytest.approx(100 / 116)


def test_a_failure_costs_restoring_and_the_steps_since_the_checkpoint() -> None:
    # Given: round 1 steps 1..50 (t 21..70), a rank fails, round 2 (failure) created at 73
    # resumes from the checkpoint at step 40: its first step is 41, logged at 78.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=140,
        rounds=(
            stepping(1, "start", 0, (1, 21), (50, 70), failed=71, ended=73, outcome="replaced"),
            stepping(2, "failure", 73, (41, 78), (100, 137), ended=140, outcome="succeeded"),
        ),
    )
    totals = assert_adds_up(compute(timeline))
    # Then: steps 41..50 were taken twice (10 s); restoring from step 50's log to step 41's start.
    assert totals["redone"] == pytest.approx(10)
    assert totals["restoring"] == pytest.approx(77 - 70)
    assert totals["starting"] == pytest.approx(20)
    assert totals["productive"] == pytest.approx((70 - 20) - 10 + (137 - 77))
    assert totals["ending"] == pytest.approx(3)


def test_an_in_place_resize_costs_only_the_switch_over() -> None:
    # Given: round 2 (resize, in place) is created at 55 while round 1 steps on until 60; the
    # re-formed group's first step (1 s) is logged at 61.5.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=101,
        rounds=(
            stepping(1, "start", 0, (1, 2), (59, 60), ended=55, outcome="replaced"),
            stepping(2, "resize", 55, (60, 61.5), (99, 100.5), ended=101, outcome="succeeded"),
        ),
    )
    totals = assert_adds_up(compute(timeline))
    assert totals["membership"] == pytest.approx(0.5)
    assert totals["redone"] == 0
    assert totals["productive"] == pytest.approx(59 + 40)


def test_a_hang_counts_from_its_last_progress_until_the_round_is_replaced() -> None:
    # Given: round 1's last step at 80, job.hang at 90 (no progress since 80), restarted at 95.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=140,
        rounds=(
            stepping(1, "start", 0, (1, 2), (79, 80), ended=95, outcome="replaced"),
            stepping(2, "restart", 95, (79, 100), (117, 138), ended=140, outcome="succeeded"),
        ),
        hangs=(Hang(round_number=1, at=90, since=80),),
    )
    totals = assert_adds_up(compute(timeline))
    assert totals["hung"] == pytest.approx(15)
    assert totals["restoring"] == pytest.approx(99 - 95)
    # Step 79 was taken again by round 2: one step redone.
    assert totals["redone"] == pytest.approx(1)


def test_a_running_job_without_an_end_trains_up_to_now() -> None:
    timeline = Timeline(created=0, now=50, running=True, rounds=(stepping(1, "start", 0, (1, 5), (40, 44)),))
    totals = assert_adds_up(compute(timeline))
    assert totals["starting"] == pytest.approx(4)
    assert totals["productive"] == pytest.approx(46)


def test_checkpoint_blocking_and_data_waits_come_out_of_productive_time() -> None:
    timeline = Timeline(
        created=0,
        now=1000,
        finished=101,
        rounds=(stepping(1, "start", 0, (1, 1), (100, 100), ended=101, outcome="succeeded", data_share=0.1),),
        checkpoints=((50.0, 2.0), (80.0, 0.5)),
    )
    totals = assert_adds_up(compute(timeline))
    assert totals["checkpoint"] == pytest.approx(2.5)
    assert totals["data"] == pytest.approx((100 - 2.5) * 0.1)
    assert totals["productive"] == pytest.approx((100 - 2.5) * 0.9)


def test_a_round_sent_back_to_the_queue_waits_as_queued() -> None:
    # Given: preempted at 40 (requeued), placed again at 70 (resume), first step logged at 75.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=120,
        rounds=(
            stepping(1, "start", 0, (1, 2), (38, 39), ended=40, outcome="requeued"),
            stepping(2, "resume", 70, (39, 75), (82, 118), ended=120, outcome="succeeded"),
        ),
    )
    totals = assert_adds_up(compute(timeline))
    assert totals["queued"] == pytest.approx(30)
    # 39 → 40 (the stop) and 70 → 74 (the launch) before training again.
    assert totals["starting"] == pytest.approx(1 + 1 + 4)


def test_a_plain_script_gets_the_round_level_part() -> None:
    # Given: no step is ever logged. Queued 5 s; round 1 runs until a rank fails at 60, round 2
    # (failure) starts at 64 and the job ends at 100.
    timeline = Timeline(
        created=0,
        now=1000,
        finished=100,
        rounds=(
            RoundFacts(1, "start", 5, ended=64, outcome="replaced", failed=60),
            RoundFacts(2, "failure", 64, ended=100, outcome="succeeded"),
        ),
    )
    totals = assert_adds_up(compute(timeline))
    assert totals["queued"] == pytest.approx(5)
    assert totals["restoring"] == pytest.approx(4)
    assert totals["productive"] == pytest.approx(55 + 36)


def test_a_window_and_the_bins_keep_every_second() -> None:
    timeline = Timeline(
        created=0,
        now=1000,
        finished=140,
        rounds=(
            stepping(1, "start", 0, (1, 21), (50, 70), failed=71, ended=73, outcome="replaced"),
            stepping(2, "failure", 73, (41, 78), (100, 137), ended=140, outcome="succeeded"),
        ),
    )
    result = compute(timeline)
    bins = result.bins(7)
    assert len(bins) == 7
    for b in bins:
        assert sum(b.values()) == pytest.approx(20)
    # The second bin (20..40) is all but its first second productive.
    assert bins[1]["starting"] == pytest.approx(0) and bins[1]["productive"] == pytest.approx(20)
    window = result.clipped(60, 90)
    assert window.wall == pytest.approx(30)
    assert sum(window.totals().values()) == pytest.approx(30)
    both = combine([result, window])
    assert both["wall_seconds"] == pytest.approx(170)
    assert both["jobs"] == 2


def test_a_job_not_yet_placed_is_all_queued() -> None:
    totals = assert_adds_up(compute(Timeline(created=0, now=30)))
    assert totals["queued"] == pytest.approx(30)
    assert compute(Timeline(created=10, now=10)).ratio is None


def test_the_sdk_step_timer_reports_the_time_between_steps_as_data_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from workers.sdk import monitor

    reported: list[dict[str, float]] = []

    class Sink:
        def metric(self, step: int, values: dict[str, float], echo: bool = True) -> None:
            reported.append(values)

    monkeypatch.setattr(monitor, "telemetry", lambda: Sink())
    timer = monitor.StepTimer(every=4)
    for step in range(1, 5):
        with timer(step):
            time.sleep(0.01)
        time.sleep(0.03)  # "fetching the next batch"
    # The first step reports alone (no gap yet); steps 2..4 have two gaps of 0.03 s in the window.
    assert reported[0]["data_wait_s"] == 0
    window = reported[1]
    assert window["data_wait_s"] == pytest.approx(0.06 / 3, abs=0.01)
    assert window["step_time_s"] == pytest.approx((0.03 + 0.06) / 3, abs=0.015)
