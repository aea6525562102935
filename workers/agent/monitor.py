"""Monitoring a round on this host: what its processes and their status files say now, as data.

`observe` polls every running rank, reads what an ended one left (runner.py's end file, its
@record error file, its stderr) into the `RankExit` the controller would be sent, and notes how
long ago a still-running rank's code ended. It signals nothing and changes nothing: decide.py
says what to do about it and the supervisor does it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from workers.agent.launcher import RankFiles
from workers.agent.lifecycle import InplaceReport, LocalRound, Rank
from workers.protocol import InplaceStatus, RankExit, RankState
from workers.sdk.elastic_control import read_state

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 30
STDERR_TAIL_BYTES = 16_384


@dataclass(frozen=True)
class RankEnded:
    """A rank process that has exited. ``exit`` is its report; its ``exit_code`` is the status its
    code ended with when runner.py recorded one and a signal only ended the teardown."""

    returncode: int  # as the process ended
    exit: RankExit
    code_status: int | None  # what runner.py recorded, when a signal ended the process
    # When its code ended, as well as the files it left tell (runner.py's end file, its error
    # file), else when it was seen ended: orders exits seen in one look, the root cause first.
    ended_at: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.exit["exit_code"] == 0


@dataclass(frozen=True)
class RankSeen:
    rank: Rank
    ended: RankEnded | None = None
    code_ended_ago: float | None = None  # seconds since its code ended, while the process lives


@dataclass(frozen=True)
class Fetched:
    bundle_dir: Path | None = None
    error: str = ""


@dataclass(frozen=True)
class Observation:
    fetching: bool = False  # its bundle is still being fetched (nothing else is looked at)
    fetched: Fetched | None = None  # the fetch finished since the last look
    ranks: tuple[RankSeen, ...] = ()  # the ranks that were running, in order
    inplace: InplaceReport | None = None  # an in-place round's ranks' word (LocalRound.reports_inplace)


def observe(local: LocalRound, look_at_teardowns: bool) -> Observation:
    fetched = None
    if local.fetch is not None:
        if not local.fetch.done():
            return Observation(fetching=True)
        error = local.fetch.exception()
        fetched = Fetched(error=str(error)) if error is not None else Fetched(bundle_dir=local.fetch.result())
    seen = []
    for rank in local.ranks:
        if rank.state != RankState.RUNNING:
            continue
        returncode = rank.handler.proc.poll()
        if returncode is not None:
            seen.append(RankSeen(rank, ended=rank_ended(rank, returncode)))
        elif look_at_teardowns and not rank.killed_in_teardown:
            seen.append(RankSeen(rank, code_ended_ago=seconds_since_code_ended(rank.files)))
        else:
            seen.append(RankSeen(rank))
    inplace = inplace_state(local) if local.reports_inplace and local.ranks else None
    return Observation(fetched=fetched, ranks=tuple(seen), inplace=inplace)


def rank_ended(rank: Rank, returncode: int) -> RankEnded:
    teardown = ""
    code_status = code_ending(rank.files) if returncode < 0 else None
    status = returncode
    if code_status is not None:
        # The code had ended: its status is the rank's; the signal only ended the teardown.
        teardown = "hung" if rank.killed_in_teardown else (signal_name(returncode) or "")
        status = code_status
    exit_ = RankExit(
        local_rank=rank.local_rank,
        rank=rank.rank,
        pid=rank.pid,
        exit_code=status if status >= 0 else None,
        signal=signal_name(status),
        error=error_message(rank, status) if status != 0 else "",
        at=time.time(),
    )
    if teardown:
        exit_["teardown"] = teardown
    return RankEnded(
        returncode=returncode, exit=exit_, code_status=code_status, ended_at=ended_at(rank.files)
    )


def ended_at(files: RankFiles) -> float:
    for path in (files.end_file, files.error_file):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return time.time()


def signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def stderr_tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - STDERR_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def error_message(rank: Rank, returncode: int) -> str:
    """The rank's @record error file (message and traceback) or, without one, its last stderr
    lines."""
    if rank.files.error_file.is_file():
        try:
            failure = ProcessFailure(
                local_rank=rank.local_rank,
                pid=rank.pid,
                exitcode=returncode,
                error_file=str(rank.files.error_file),
            )
            data = failure.error_file_data.get("message")
            if isinstance(data, dict):
                callstack = data.get("extraInfo", {}).get("py_callstack", "")
                return str(callstack or data.get("message", "")) or failure.message
            return failure.message
        except Exception:
            logger.warning("unreadable error file %s", rank.files.error_file)
    return stderr_tail(rank.files.stderr)


def code_ending(files: RankFiles) -> int | None:
    """The exit status the rank's Python code ended with, as runner.py recorded it before the
    interpreter's teardown; None when it recorded nothing (the code has not ended, was not run
    by the runner, or ended by a signal)."""
    try:
        status = json.loads(files.end_file.read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if isinstance(status, int) else None


def seconds_since_code_ended(files: RankFiles) -> float | None:
    try:
        return time.time() - files.end_file.stat().st_mtime
    except OSError:
        return None


def inplace_state(local: LocalRound) -> InplaceReport:
    """An in-place round's progress on this host, from its ranks' SDK state files (each an
    InplaceStatus): FORMED (and when the last rank formed) once every local rank formed the
    round's group or left, FAILED (with the reason) when one could not, WAITING when one saw a
    peer fail mid-step and waits for the next round, else FORMING."""
    states = [read_state(rank.files.control) for rank in local.ranks]
    current = [state for state in states if state is not None and state.get("round") == local.number]
    for worst in (InplaceStatus.FAILED, InplaceStatus.WAITING):
        for state in current:
            if state["state"] is worst:
                return InplaceReport(worst, str(state.get("reason", "")))
    done = (InplaceStatus.FORMED, InplaceStatus.LEFT)
    if states and len(current) == len(states) and all(state["state"] in done for state in current):
        times = [float(state.get("time", 0.0)) for state in current]
        return InplaceReport(InplaceStatus.FORMED, formed_at=max(times, default=None))
    return InplaceReport(InplaceStatus.FORMING)
