"""The agent's decisions about a round on its host (workers/agent/decide.py), and the exit reports
monitor.py builds, in-process: no rank processes, no Celery, no database. Each test gives a round
and an observation and asserts the exact actions, in order."""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from workers.agent.decide import (
    End,
    FailLaunch,
    Kill,
    KillInTeardown,
    Move,
    NoteInplace,
    Poke,
    Reap,
    ReportExit,
    SetDeadline,
    Spawn,
    StopReason,
    decide_stop,
    decide_tick,
)
from workers.agent.launcher import RankFiles, RankHandler
from workers.agent.lifecycle import InplaceReport, LocalRound, LocalState, Rank
from workers.agent.monitor import Fetched, Observation, RankEnded, RankSeen, rank_ended
from workers.protocol import InplaceStatus, RankExit, RankState, RoundSpec

NOW = 1000.0
GRACE = 5.0
TEARDOWN = 60.0
S = LocalState


def files(directory: Path = Path("/nonexistent")) -> RankFiles:
    return RankFiles(
        directory=directory,
        stdout=directory / "stdout.log",
        stderr=directory / "stderr.log",
        error_file=directory / "error.json",
        telemetry=directory / "telemetry.jsonl",
        end_file=directory / "ended.json",
        control=directory / "control.json",
        progress=directory / "progress",
    )


def rank(
    local_rank: int, state: RankState = RankState.RUNNING, directory: Path = Path("/nonexistent")
) -> Rank:
    handler = cast(RankHandler, SimpleNamespace(proc=SimpleNamespace(pid=4000 + local_rank)))
    return Rank(local_rank, 10 + local_rank, files(directory), handler, state=state)


def round_in(state: LocalState, *ranks: Rank, deadline: float = 0.0) -> LocalRound:
    spec = RoundSpec(job_id=7, round=3, nproc_per_node=len(ranks), grace_period=GRACE)  # type: ignore[typeddict-item]
    local = LocalRound(spec=spec, ranks=list(ranks), stop_deadline=deadline)
    local.state = state
    return local


def ended(r: Rank, code: int) -> RankEnded:
    """The rank's process ended with ``code`` (negative: by that signal, as Popen says)."""
    by_signal = signal.Signals(-code).name if code < 0 else None
    exit_ = RankExit(
        local_rank=r.local_rank,
        rank=r.rank,
        pid=r.pid,
        exit_code=None if by_signal else code,
        signal=by_signal,
        error="",
        at=NOW,
    )
    return RankEnded(returncode=code, exit=exit_, code_status=None)


def tick(
    local: LocalRound, *seen: RankSeen, fetched: Fetched | None = None, fetching: bool = False
) -> list[object]:
    return list(decide_tick(local, Observation(fetching, fetched, tuple(seen)), NOW, GRACE, TEARDOWN))


# --- starting ------------------------------------------------------------------------------
def test_nothing_is_done_while_the_bundle_is_fetched() -> None:
    assert tick(round_in(S.STARTING), fetching=True) == []
    assert tick(round_in(S.STOPPING), fetching=True) == []


def test_a_fetched_bundle_is_spawned_and_a_failed_fetch_fails_the_launch() -> None:
    assert tick(round_in(S.STARTING), fetched=Fetched(Path("/b"))) == [Spawn(Path("/b"))]
    assert tick(round_in(S.STARTING), fetched=Fetched(error="404")) == [FailLaunch("404")]


def test_a_bundle_fetched_for_a_round_told_to_stop_is_dropped_and_the_round_ends_stopped() -> None:
    assert tick(round_in(S.STOPPING), fetched=Fetched(Path("/b"))) == [End(S.STOPPED)]


def test_a_failed_launch_ends_failed_once_its_started_ranks_are_reaped() -> None:
    r0, r1 = rank(0), rank(1)
    local = round_in(S.LAUNCH_FAILED, r0, r1)
    assert tick(local, RankSeen(r0, ended(r0, -9)), RankSeen(r1)) == [
        Reap(r0, ended(r0, -9), RankState.STOPPED)
    ]
    r0.state = RankState.STOPPED
    assert tick(local, RankSeen(r1, ended(r1, -9))) == [
        Reap(r1, ended(r1, -9), RankState.STOPPED),
        End(S.FAILED),
    ]
    assert tick(round_in(S.LAUNCH_FAILED)) == [End(S.FAILED)]


# --- running -------------------------------------------------------------------------------
def test_a_rank_that_succeeds_is_reported_and_the_round_ends_with_the_last() -> None:
    r0, r1 = rank(0), rank(1)
    local = round_in(S.RUNNING, r0, r1)
    assert tick(local, RankSeen(r0, ended(r0, 0)), RankSeen(r1)) == [
        Reap(r0, ended(r0, 0), RankState.SUCCEEDED),
        ReportExit(ended(r0, 0).exit, failed=False),
    ]
    r0.state = RankState.SUCCEEDED
    assert tick(local, RankSeen(r1, ended(r1, 0))) == [
        Reap(r1, ended(r1, 0), RankState.SUCCEEDED),
        ReportExit(ended(r1, 0).exit, failed=False),
        End(S.SUCCEEDED),
    ]


def test_a_failed_rank_fails_the_round_and_other_exits_seen_with_it_are_reported_too() -> None:
    r0, r1, r2 = rank(0), rank(1), rank(2)
    local = round_in(S.RUNNING, r0, r1, r2)
    actions = tick(local, RankSeen(r0, ended(r0, 1)), RankSeen(r1, ended(r1, 0)), RankSeen(r2))
    assert actions == [
        Reap(r0, ended(r0, 1), RankState.FAILED),
        ReportExit(ended(r0, 1).exit, failed=True),
        Reap(r1, ended(r1, 0), RankState.SUCCEEDED),
        ReportExit(ended(r1, 0).exit, failed=False),
        Move(S.FAILING),
        SetDeadline(NOW + GRACE),
        Kill(r2, signal.SIGTERM),
    ]


def test_a_rank_that_failed_on_its_own_while_the_round_stopped_for_a_peer_is_reported() -> None:
    # rank 0 failed first as seen (its peer's exception broke its collective), so the round stops
    r0, r1, r2 = rank(0), rank(1), rank(2)
    local = round_in(S.RUNNING, r0, r1, r2)
    tick(local, RankSeen(r0, ended(r0, 1)), RankSeen(r1), RankSeen(r2))
    r0.state, local.state, local.stop_deadline = RankState.FAILED, S.FAILING, NOW + GRACE
    # r1, which raised (exit code 1, no signal), is a failure too; r2, ended by the SIGTERM, is not
    assert tick(local, RankSeen(r1, ended(r1, 1)), RankSeen(r2, ended(r2, -15))) == [
        Reap(r1, ended(r1, 1), RankState.FAILED),
        ReportExit(ended(r1, 1).exit, failed=True),
        Reap(r2, ended(r2, -15), RankState.STOPPED),
        End(S.FAILED),
    ]
    # a round stopped by a command reports nothing of the kind
    r3 = rank(3)
    stopping = round_in(S.STOPPING, r3, deadline=NOW + GRACE)
    assert tick(stopping, RankSeen(r3, ended(r3, 1))) == [
        Reap(r3, ended(r3, 1), RankState.STOPPED),
        End(S.STOPPED),
    ]


def test_a_round_recovered_in_place_keeps_the_failed_ranks_local_peers_running() -> None:
    r0, r1 = rank(0), rank(1)
    local = round_in(S.RUNNING, r0, r1)
    local.spec["recover_in_place"] = True
    # the failure is reported; r1 is not signalled (its SDK waits for the controller's next round)
    assert tick(local, RankSeen(r0, ended(r0, -9)), RankSeen(r1)) == [
        Reap(r0, ended(r0, -9), RankState.FAILED),
        ReportExit(ended(r0, -9).exit, failed=True),
    ]
    r0.state = RankState.FAILED
    assert tick(local, RankSeen(r1)) == []
    # no next round came and the peer ended too: the host's round failed
    assert tick(local, RankSeen(r1, ended(r1, 0))) == [
        Reap(r1, ended(r1, 0), RankState.SUCCEEDED),
        ReportExit(ended(r1, 0).exit, failed=False),
        Move(S.FAILING),
        End(S.FAILED),
    ]


def test_a_round_recovered_in_place_whose_only_rank_fails_ends_failed() -> None:
    r0 = rank(0)
    local = round_in(S.RUNNING, r0)
    local.spec["recover_in_place"] = True
    assert tick(local, RankSeen(r0, ended(r0, 1))) == [
        Reap(r0, ended(r0, 1), RankState.FAILED),
        ReportExit(ended(r0, 1).exit, failed=True),
        Move(S.FAILING),
        SetDeadline(NOW + GRACE),
        End(S.FAILED),
    ]


def test_failures_seen_in_one_look_are_reported_root_cause_first() -> None:
    # Rank 1 raised; rank 0's collective broke a moment later; both are seen in the same look.
    r0, r1 = rank(0), rank(1)
    local = round_in(S.RUNNING, r0, r1)
    broke, raised = replace(ended(r0, 1), ended_at=NOW + 0.2), replace(ended(r1, 1), ended_at=NOW)
    assert tick(local, RankSeen(r0, broke), RankSeen(r1, raised)) == [
        Reap(r1, raised, RankState.FAILED),
        ReportExit(raised.exit, failed=True),
        Reap(r0, broke, RankState.FAILED),
        ReportExit(broke.exit, failed=True),
        Move(S.FAILING),
        SetDeadline(NOW + GRACE),
        End(S.FAILED),
    ]


def test_a_rank_hung_in_its_teardown_is_killed_once_past_the_timeout_and_only_while_running() -> None:
    r0 = rank(0)
    assert tick(round_in(S.RUNNING, r0), RankSeen(r0, code_ended_ago=TEARDOWN + 1)) == [
        KillInTeardown(r0, TEARDOWN + 1)
    ]
    assert tick(round_in(S.RUNNING, r0), RankSeen(r0, code_ended_ago=TEARDOWN - 1)) == []
    assert tick(round_in(S.STOPPING, r0, deadline=NOW + 1), RankSeen(r0, code_ended_ago=TEARDOWN + 1)) == []
    r0.killed_in_teardown = True
    assert tick(round_in(S.RUNNING, r0), RankSeen(r0, code_ended_ago=TEARDOWN + 1)) == []


# --- stopping ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stopping", "killing", "outcome"),
    [(S.STOPPING, S.KILLING, S.STOPPED), (S.FAILING, S.KILLING_FAILED, S.FAILED)],
)
def test_ranks_still_running_after_the_grace_period_are_killed_then_the_round_ends(
    stopping: LocalState, killing: LocalState, outcome: LocalState
) -> None:
    r0, r1 = rank(0, RankState.FAILED), rank(1)
    assert tick(round_in(stopping, r0, r1, deadline=NOW + 0.5), RankSeen(r1)) == []
    local = round_in(stopping, r0, r1, deadline=NOW)
    assert tick(local, RankSeen(r1)) == [Move(killing), Kill(r1, signal.SIGKILL)]
    local.state = killing
    assert tick(local, RankSeen(r1)) == []  # killed once
    assert tick(local, RankSeen(r1, ended(r1, -9))) == [
        Reap(r1, ended(r1, -9), RankState.STOPPED),
        End(outcome),
    ]


def test_the_first_stop_terms_running_ranks_and_starts_the_grace_period() -> None:
    r0, r1 = rank(0, RankState.SUCCEEDED), rank(1)
    assert decide_stop(round_in(S.RUNNING, r0, r1), StopReason.COMMAND, GRACE, NOW) == [
        Move(S.STOPPING),
        SetDeadline(NOW + GRACE),
        Kill(r1, signal.SIGTERM),
    ]
    assert decide_stop(round_in(S.STARTING), StopReason.COMMAND, -1.0, NOW) == [
        Move(S.STOPPING),
        SetDeadline(NOW),
    ]


def test_a_later_stop_only_shortens_the_grace_period_and_a_command_outranks_a_failure() -> None:
    r0 = rank(0)
    assert decide_stop(round_in(S.FAILING, r0, deadline=NOW + 30), StopReason.COMMAND, GRACE, NOW) == [
        Move(S.STOPPING),
        SetDeadline(NOW + GRACE),
    ]
    assert decide_stop(round_in(S.STOPPING, r0, deadline=NOW + 1), StopReason.COMMAND, GRACE, NOW) == [
        Move(S.STOPPING),
        SetDeadline(NOW + 1),
    ]
    assert decide_stop(round_in(S.KILLING_FAILED, r0, deadline=NOW), StopReason.COMMAND, GRACE, NOW)[
        0
    ] == Move(S.KILLING)
    assert decide_stop(round_in(S.LAUNCH_FAILED, r0), StopReason.COMMAND, GRACE, NOW)[0] == Move(S.KILLING)
    assert decide_stop(round_in(S.STOPPED), StopReason.COMMAND, GRACE, NOW) == []


# --- exit reports (monitor.py), from the files a rank leaves -------------------------------
def test_a_failed_rank_is_reported_with_its_exit_code_and_stderr_tail(tmp_path: Path) -> None:
    r0 = rank(0, directory=tmp_path)
    (tmp_path / "stderr.log").write_text("".join(f"line {i}\n" for i in range(100)) + "ValueError: boom\n")
    report = rank_ended(r0, 3)
    assert not report.succeeded
    assert report.exit["exit_code"] == 3 and report.exit["signal"] is None and report.exit["pid"] == 4000
    assert report.exit["error"].endswith("ValueError: boom") and "line 71" in report.exit["error"]
    assert "line 70" not in report.exit["error"]  # the last 30 lines
    assert "teardown" not in report.exit


def test_a_rank_killed_in_its_teardown_is_reported_with_its_code_status(tmp_path: Path) -> None:
    r0 = rank(0, directory=tmp_path)
    (tmp_path / "ended.json").write_text(json.dumps({"status": 0}))
    r0.killed_in_teardown = True
    report = rank_ended(r0, -signal.SIGKILL)
    assert report.succeeded and report.code_status == 0 and report.returncode == -9
    assert report.exit["exit_code"] == 0 and report.exit["signal"] is None and report.exit["error"] == ""
    assert report.exit["teardown"] == "hung"
    r1 = rank(1, directory=tmp_path)  # not killed by the agent: the teardown's signal is named
    assert rank_ended(r1, -signal.SIGSEGV).exit["teardown"] == "SIGSEGV"
    (tmp_path / "ended.json").unlink()
    killed = rank_ended(r1, -signal.SIGKILL)
    assert killed.exit["exit_code"] is None and killed.exit["signal"] == "SIGKILL" and not killed.succeeded


# --- parameter-server rounds ----------------------------------------------------------------
def ps_round(*processes: dict[str, object]) -> tuple[LocalRound, list[Rank]]:
    ranks = [rank(i) for i in range(len(processes))]
    local = round_in(S.RUNNING, *ranks)
    local.spec["ps"] = {  # type: ignore[typeddict-unknown-key]
        "mode": "async",
        "coordinator": "h:1",
        "addresses": ["h:2"],
        "worker_count": 2,
        "processes": list(processes),  # type: ignore[arg-type]
    }
    return local, ranks


def test_a_failed_ps_worker_is_reported_but_fails_nothing_and_a_failed_server_fails_the_round() -> None:
    local, (server, worker, _other) = ps_round(
        {"role": "ps", "index": 0, "rank": 0},
        {"role": "worker", "index": 0, "rank": 1},
        {"role": "worker", "index": 1, "rank": 2},
    )
    assert tick(local, RankSeen(worker, ended(worker, -9))) == [
        Reap(worker, ended(worker, -9), RankState.FAILED),
        ReportExit(ended(worker, -9).exit, failed=False),
    ]
    assert tick(local, RankSeen(server, ended(server, 1)))[:3] == [
        Reap(server, ended(server, 1), RankState.FAILED),
        ReportExit(ended(server, 1).exit, failed=True),
        Move(S.FAILING),
    ]


def test_a_removed_ps_worker_that_exits_is_a_stop_and_is_not_reported() -> None:
    local, (server, worker) = ps_round(
        {"role": "ps", "index": 0, "rank": 0},
        {"role": "worker", "index": 0, "rank": 1, "removed": True},
    )
    assert tick(local, RankSeen(worker, ended(worker, -15)), RankSeen(server)) == [
        Reap(worker, ended(worker, -15), RankState.STOPPED)
    ]


# --- in place ------------------------------------------------------------------------------
def test_an_in_place_word_is_kept_when_it_changes_and_waiting_pokes_the_heartbeat_once() -> None:
    r0 = rank(0)
    local = round_in(S.RUNNING, r0)
    local.spec["recover_in_place"] = True
    forming, waiting = InplaceReport(InplaceStatus.FORMING), InplaceReport(InplaceStatus.WAITING, "peer died")

    def look(report: InplaceReport) -> list[object]:
        return list(
            decide_tick(local, Observation(ranks=(RankSeen(r0),), inplace=report), NOW, GRACE, TEARDOWN)
        )

    assert look(forming) == [NoteInplace(forming)]
    local.inplace = forming
    assert look(forming) == []  # nothing new
    assert look(waiting) == [NoteInplace(waiting), Poke()]
    local.inplace = waiting
    assert look(waiting) == []  # told once
    # A round that is only carried over (not recovered in place) keeps the word but pokes nobody
    del local.spec["recover_in_place"]
    local.inplace = forming
    assert look(waiting) == [NoteInplace(waiting)]


def test_a_ps_hosts_part_stays_open_when_its_workers_have_all_ended() -> None:
    # Given a host with two workers only (the coordinator and the PS run elsewhere)
    local, (first, second) = ps_round(
        {"role": "worker", "index": 0, "rank": 2},
        {"role": "worker", "index": 1, "rank": 3},
    )
    # when one fails and the other finishes
    failed = tick(local, RankSeen(first, ended(first, 1)), RankSeen(second, ended(second, 0)))
    # then both are reported, and the round stays open: the controller may start more workers
    # here (a resize, a hybrid job's next dense group) and ends the round itself
    assert failed == [
        Reap(first, ended(first, 1), RankState.FAILED),
        ReportExit(ended(first, 1).exit, failed=False),
        Reap(second, ended(second, 0), RankState.SUCCEEDED),
        ReportExit(ended(second, 0).exit, failed=False),
    ]
    first.state, second.state = RankState.FAILED, RankState.SUCCEEDED
    assert tick(local) == []
    # and a stop then ends it STOPPED
    local.state = S.STOPPING
    assert tick(local) == [End(S.STOPPED)]


def test_a_rank_that_exited_non_zero_never_ends_its_round_as_succeeded() -> None:
    # A round recovered in place keeps a failed rank's peer; the peer then ends by itself with 0
    dead, peer = rank(0, RankState.FAILED), rank(1)
    local = round_in(S.RUNNING, dead, peer)
    local.spec["recover_in_place"] = True
    assert tick(local, RankSeen(peer, ended(peer, 0))) == [
        Reap(peer, ended(peer, 0), RankState.SUCCEEDED),
        ReportExit(ended(peer, 0).exit, failed=False),
        Move(S.FAILING),
        End(S.FAILED),
    ]
