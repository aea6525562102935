"""Whom the agent's stop signal reaches (launcher.stop_signal_target, actor.signal_rank), with
real rank processes: SIGTERM to a Python rank reaches its interpreter alone, so its children (a
DataLoader's workers) live until its code has stopped; any other signal, and SIGTERM to a rank
that is not a Python interpreter, reaches the whole process group."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import psutil

from tests.support.agents import pid_alive, wait_until
from workers.agent.actor import signal_rank
from workers.agent.launcher import Command, RankFiles, RankHandler, stop_signal_target
from workers.agent.lifecycle import Rank

# On SIGTERM it notes whether its child (in its process group) still runs, then exits 0.
PYTHON_RANK = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    child = subprocess.Popen(["sleep", "60"])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(out + ".child", "w") as fh:
        fh.write(str(child.pid))
    while not stop:
        time.sleep(0.02)
    with open(out, "w") as fh:
        fh.write("child alive" if child.poll() is None else "child dead")
    """
)


def files(tmp_path: Path) -> RankFiles:
    directory = tmp_path / "rank-0"
    directory.mkdir()
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


def start(tmp_path: Path, command: Command) -> Rank:
    rank_files = files(tmp_path)
    env = {"PATH": os.environ["PATH"], "TRAINYARD_END_FILE": str(rank_files.end_file)}
    return Rank(0, 0, rank_files, RankHandler(command, env, rank_files, 0))


def child_pid(path: Path) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip() != "", 30)
    return int(path.read_text())


def test_sigterm_reaches_a_python_ranks_interpreter_alone(tmp_path: Path) -> None:
    # Given a Python rank with a child in its process group
    script, out = tmp_path / "rank.py", tmp_path / "seen"
    script.write_text(PYTHON_RANK)
    rank = start(tmp_path, Command(sys.executable, (str(script), str(out)), tmp_path))
    child = child_pid(Path(f"{out}.child"))
    try:
        assert stop_signal_target(rank.handler, signal.SIGTERM) == "process"
        assert stop_signal_target(rank.handler, signal.SIGKILL) == "group"
        assert os.getpgid(child) == rank.pid
        # When the agent asks it to stop
        signal_rank(rank, signal.SIGTERM)
        # Then its code stops with its child still running, and ends cleanly
        assert rank.handler.proc.wait(timeout=30) == 0
        assert out.read_text() == "child alive"
        assert pid_alive(child)
        # and a SIGKILL (what reaping the rank sends) takes the rest of its group
        signal_rank(rank, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(child), 10)
    finally:
        rank.handler.close(signal.SIGKILL)


def test_sigterm_reaches_the_whole_group_of_a_rank_that_is_not_python(tmp_path: Path) -> None:
    # Given a shell rank whose child would stop its work on SIGTERM
    out = tmp_path / "seen"
    rank = start(tmp_path, Command("/bin/sh", ("-c", f'sleep 60 & echo $! > "{out}.child"; wait'), tmp_path))
    child = child_pid(Path(f"{out}.child"))
    try:
        assert stop_signal_target(rank.handler, signal.SIGTERM) == "group"
        # When the agent asks it to stop
        signal_rank(rank, signal.SIGTERM)
        # Then the shell's child got the signal too
        assert wait_until(lambda: not pid_alive(child), 10)
        assert rank.handler.proc.wait(timeout=10) != 0
    finally:
        rank.handler.close(signal.SIGKILL)
        if pid_alive(child):
            psutil.Process(child).kill()


def test_python_with_interpreter_options_is_signalled_as_a_group(tmp_path: Path) -> None:
    # `python -u train.py` runs as given (not under the runner): it is treated as any binary
    rank = start(tmp_path, Command(sys.executable, ("-u", "-c", "import time; time.sleep(60)"), tmp_path))
    try:
        assert not rank.handler.runs_python
        assert stop_signal_target(rank.handler, signal.SIGTERM) == "group"
    finally:
        rank.handler.close(signal.SIGKILL)
