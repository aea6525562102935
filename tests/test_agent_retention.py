"""Past rounds' local files go once unchanged for --keep-rounds-days; rounds the agent still holds
stay whatever their age."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support.agents import (
    AgentProcs,
    ControlQueue,
    agent_procs,
    control_queue,
    one_rank_round,
    start_registered,
    wait_until,
)
from workers import protocol

__all__ = ["agent_procs", "control_queue"]

MONTH = 30 * 86_400


def make_round(rounds: Path, job_id: int, number: int, *, age: float) -> Path:
    directory = rounds / f"job-{job_id}" / f"round-{number}"
    (directory / "rank-0").mkdir(parents=True)
    (directory / "rank-0" / "stdout.log").write_text("a line\n")
    age_tree(directory, age)
    return directory


def age_tree(directory: Path, age: float) -> None:
    then = time.time() - age
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            os.utime(os.path.join(root, name), (then, then))
        os.utime(root, (then, then))


def test_old_rounds_go_and_held_or_recent_ones_stay(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent's data directory with rounds a month old and one from today
    rounds = agent_procs.root / "agents" / "host-keep" / "rounds"
    old_job = make_round(rounds, 500, 1, age=MONTH).parent
    recent = make_round(rounds, 501, 1, age=3600)
    old_round_of_a_job = make_round(rounds, 502, 3, age=MONTH)

    # When the agent starts (default: keep 7 days)
    agent, _ = start_registered(agent_procs, control_queue, "host-keep")

    # Then the month-old rounds are removed (and the job directory they left empty), today's stays
    assert wait_until(lambda: not old_job.exists() and not old_round_of_a_job.exists(), 10), agent.log()[
        -2000:
    ]
    assert recent.is_dir()

    # When job 502's round 4 is running, and its files are made a month old
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=one_rank_round(502, sleeper, round_=4))
    running = rounds / "job-502" / "round-4"
    assert wait_until((running / "rank-0" / "stdout.log").exists, 30)
    age_tree(running, MONTH)
    # ... and another month-old round appears, then job 503's round ends (which prunes)
    another_old = make_round(rounds, 504, 1, age=MONTH)
    quick = tmp_path / "quick.py"
    quick.write_text("print('done')\n")
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=one_rank_round(503, quick))
    control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 30, job_id=503)

    # Then the pass removed the other old round but not the running one, nor the one just ended
    assert wait_until(lambda: not another_old.exists(), 10)
    assert running.is_dir() and (running / "rank-0" / "stdout.log").is_file()
    assert (rounds / "job-503" / "round-1" / "rank-0" / "stdout.log").read_text() == "done\n"
    assert recent.is_dir()
