"""The agent's warm pool: a rank started from a pre-started interpreter behaves as a cold
``python script.py`` / ``python -m module`` would (environment, argv, __main__, imports, exit
codes and tracebacks), the pool refills, and a SIGKILLed agent leaves no warm process behind."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.agents import (
    AgentProcess,
    AgentProcs,
    ControlMessage,
    ControlQueue,
    agent_procs,
    control_queue,
    pid_alive,
    rank_pids,
    round_spec,
    start_registered,
    wait_until,
    warm_processes,
)
from workers import protocol
from workers.agent.runner import END_FILE_ENV
from workers.agent.warm import AUTOGROUP_PATH, IMPORT_NICENESS
from workers.net import free_port
from workers.protocol import RoundSpec

# The pool pauses imports while the host's cores are busy: these run alone (tests/conftest.py).
pytestmark = pytest.mark.alone

__all__ = ["agent_procs", "control_queue"]

PROBE = """
import json, os, sys, time
import helper  # a sibling module of the script, found through sys.path[0]
import torch

def autogroup_nice():
    try:
        with open("/proc/self/autogroup") as fh:
            return fh.read().split()[-1]
    except OSError:
        return None

def main() -> None:
    out = os.environ["PROBE_OUT"]
    record = {
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "helper": helper.VALUE,
        "threads": torch.get_num_threads(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "stdin_empty": sys.stdin.read() == "",
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "autogroup_nice": autogroup_nice(),
    }
    with open(os.path.join(out, "rank-%s.json" % os.environ["RANK"]), "w") as fh:
        json.dump(record, fh)
    print("probe stdout rank", os.environ["RANK"], flush=True)
    mode = sys.argv[1]
    if mode == "sleep":
        time.sleep(300)
    elif mode == "raise":
        raise ValueError("probe failure " + os.environ["RANK"])
    elif mode == "record":
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def failing() -> None:
            raise KeyError("recorded probe failure")

        failing()
    elif mode == "exit3":
        sys.exit(3)
    elif mode == "exitmsg":
        sys.exit("probe exit message")
    elif mode == "ending":
        # What the interpreter does after the script, in its order: join non-daemon threads,
        # run atexit handlers, flush stdout (a file here, so fully buffered).
        import atexit, threading

        done = os.path.join(out, "thread-done")

        def late_writer() -> None:
            time.sleep(0.5)
            open(done, "w").close()

        def at_exit() -> None:
            with open(os.path.join(out, "atexit.json"), "w") as fh:
                json.dump({"thread_done_before": os.path.exists(done)}, fh)

        atexit.register(at_exit)
        threading.Thread(target=late_writer).start()
        print("unflushed probe line")
    elif mode == "interrupt":
        raise KeyboardInterrupt

if __name__ == "__main__":
    main()
"""

PACKAGE_MAIN = """
import json, os, sys
from . import helper  # relative import inside the package run with -m

with open(os.path.join(os.environ["PROBE_OUT"], "module-%s.json" % os.environ["RANK"]), "w") as fh:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "helper": helper.VALUE,
               "package": __package__}, fh)
sys.exit(int(sys.argv[1]))
"""

# Differ between the ranks of one round by design.
PER_RANK_VARS = {
    "RANK",
    "LOCAL_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_ERROR_FILE",
    protocol.ENV_TELEMETRY,
    protocol.ENV_CONTROL,
    protocol.ENV_TENSORBOARD_DIR,
    protocol.ENV_PROGRESS,
    END_FILE_ENV,
}


def write_probe(root: Path) -> Path:
    code = root / "code"
    (code / "probepkg").mkdir(parents=True)
    (code / "probe.py").write_text(textwrap.dedent(PROBE))
    (code / "helper.py").write_text("VALUE = 'sibling'\n")
    (code / "probepkg" / "__init__.py").write_text("")
    (code / "probepkg" / "__main__.py").write_text(textwrap.dedent(PACKAGE_MAIN))
    (code / "probepkg" / "helper.py").write_text("VALUE = 'relative'\n")
    out = root / "out"
    out.mkdir()
    return code


def probe_spec(
    root: Path,
    job_id: int,
    *,
    nproc: int,
    entrypoint: str,
    args: list[str],
    env: dict[str, str] | None = None,
) -> RoundSpec:
    spec = round_spec(
        job_id=job_id,
        round_=1,
        node_rank=0,
        nnodes=1,
        nproc_per_node=nproc,
        master_port=free_port(),
        entrypoint=entrypoint,
        args=args,
        env={"PROBE_OUT": str(root / "out"), **(env or {})},
    )
    spec["workdir"] = str(root / "code")
    return spec


def start_probe(control_queue: ControlQueue, agent: AgentProcess, root: Path, job_id: int, mode: str) -> None:
    """Starts a one-rank round of ``probe.py <mode>``."""
    spec = probe_spec(root, job_id, nproc=1, entrypoint="probe.py", args=[mode])
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)


def warm_pids(agent: AgentProcess) -> list[int]:
    return [proc.pid for proc in warm_processes(agent)]


def wait_for_pool(agent: AgentProcess, size: int, timeout: float = 60.0) -> list[int]:
    assert wait_until(lambda: len(warm_pids(agent)) >= size, timeout), agent.log()[-3000:]
    return warm_pids(agent)


def read_json(path: Path) -> dict[str, Any]:
    assert wait_until(path.exists, 90), path
    assert wait_until(lambda: path.read_text().endswith("}"), 10)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def exit_of(control_queue: ControlQueue, job_id: int, rank: int) -> dict[str, Any]:
    message = control_queue.wait_for(
        protocol.CONTROL_RANK_EXITED, 90, job_id=job_id, match=lambda m: m.kwargs["exit"]["rank"] == rank
    )
    exit_: dict[str, Any] = message.kwargs["exit"]
    return exit_


def test_a_warm_rank_sees_what_a_cold_rank_sees(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent with a full pool of 2 warm interpreters
    agent, _ = start_registered(agent_procs, control_queue, "host-warm")
    warm = wait_for_pool(agent, 2)
    code = write_probe(tmp_path)

    # (importing and idle, they run at the lowest CPU priority, their autogroup's too, from
    # their first line on)
    def lowest_priority(pid: int) -> bool:
        autogroup = Path(f"/proc/{pid}/autogroup")
        return psutil.Process(pid).nice() == IMPORT_NICENESS and (
            not AUTOGROUP_PATH.exists() or autogroup.read_text().split()[-1] == str(IMPORT_NICENESS)
        )

    assert wait_until(lambda: all(lowest_priority(pid) for pid in warm), 10)

    # When a 3-rank round of a plain script starts: two ranks come from the pool, the third
    # starts cold (the refill waits until the round has started)
    spec = probe_spec(tmp_path, 61, nproc=3, entrypoint="probe.py", args=["sleep", "--flag", "x y"])
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)
    heartbeat = control_queue.wait_for(
        protocol.CONTROL_HEARTBEAT, 60, node=agent.name, match=lambda m: len(rank_pids(m, 61, 1)) == 3
    )
    pids = rank_pids(heartbeat, 61, 1)
    assert sorted(pids[:2]) == sorted(warm), (pids, warm)
    assert pids[2] not in warm
    records = [read_json(tmp_path / "out" / f"rank-{rank}.json") for rank in range(3)]
    cold = records[2]

    # Then every warm rank ran the script as `python probe.py sleep --flag "x y"` would, with the
    # same environment as the cold rank apart from the per-rank variables: nothing of the warm
    # interpreter's own start is left
    for rank, record in enumerate(records):
        assert record["name"] == "__main__"
        assert record["argv"] == ["probe.py", "sleep", "--flag", "x y"]
        assert record["path0"] == os.path.realpath(code)
        assert record["cwd"] == os.path.realpath(code)
        assert record["helper"] == "sibling"
        assert record["threads"] == 1
        assert record["cuda_initialized"] is False
        assert record["stdin_empty"] is True
        assert (record["nice"], record["autogroup_nice"]) == (cold["nice"], cold["autogroup_nice"])
        env = record["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_PORT"] == str(spec["master_port"])
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"rank-{rank}/error.json")
        assert env[protocol.ENV_TENSORBOARD_DIR].endswith(f"round-1/rank-{rank}")
        common = {k: v for k, v in env.items() if k not in PER_RANK_VARS}
        cold_common = {k: v for k, v in cold["env"].items() if k not in PER_RANK_VARS}
        assert common == cold_common, set(common.items()) ^ set(cold_common.items())
    # ... and its stdout went to its own log file
    stdout = tmp_path / "agents" / agent.name / "rounds" / "job-61" / "round-1" / "rank-0" / "stdout.log"
    assert wait_until(lambda: stdout.exists() and "probe stdout rank 0" in stdout.read_text(), 10)

    # And the pool refills with new interpreters while the round runs
    assert wait_until(lambda: len(warm_pids(agent)) == 2 and not set(warm_pids(agent)) & set(pids), 60)

    # When OMP_NUM_THREADS=2 is asked for (applied at launch) and, separately, a variable that
    # only matters at interpreter start (PYTHONHASHSEED) differs
    control_queue.send(agent.name, protocol.AGENT_STOP_JOB, job_id=61, round=1, grace_period=5.0)
    control_queue.wait_for(protocol.CONTROL_ROUND_ENDED, 60, node=agent.name, job_id=61)
    warm = wait_for_pool(agent, 2)
    threads = probe_spec(
        tmp_path, 62, nproc=1, entrypoint="probe.py", args=["exit3"], env={"OMP_NUM_THREADS": "2"}
    )
    seeded = probe_spec(
        tmp_path, 63, nproc=1, entrypoint="probe.py", args=["exit3"], env={"PYTHONHASHSEED": "7"}
    )
    (tmp_path / "out" / "rank-0.json").unlink()
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=threads)
    first = exit_of(control_queue, 62, 0)
    assert first["pid"] in warm
    assert first["exit_code"] == 3
    assert read_json(tmp_path / "out" / "rank-0.json")["threads"] == 2
    (tmp_path / "out" / "rank-0.json").unlink()
    control_queue.send(agent.name, protocol.AGENT_START_ROUND, spec=seeded)
    second = exit_of(control_queue, 63, 0)

    # Then the first ran warm with 2 threads, the second started cold with its seed
    assert second["pid"] not in warm
    assert second["exit_code"] == 3
    assert read_json(tmp_path / "out" / "rank-0.json")["env"]["PYTHONHASHSEED"] == "7"


def test_warm_ranks_report_exits_like_cold_ones(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent with a full pool of 2 warm interpreters
    agent, _ = start_registered(agent_procs, control_queue, "host-warm-exit")
    warm = wait_for_pool(agent, 2)
    write_probe(tmp_path)

    # When two single-rank jobs start from the pool: one raises, one exits with a message
    start_probe(control_queue, agent, tmp_path, 71, "raise")
    start_probe(control_queue, agent, tmp_path, 72, "exitmsg")
    raised, message = exit_of(control_queue, 71, 0), exit_of(control_queue, 72, 0)

    # Then both were warm, and each is reported as the interpreter reports it: an uncaught
    # exception exits 1 with its traceback, SystemExit("text") exits 1 printing the text
    assert {raised["pid"], message["pid"]} == set(warm)
    assert raised["exit_code"] == 1 and raised["signal"] is None
    assert "Traceback (most recent call last)" in raised["error"]
    assert "ValueError: probe failure 0" in raised["error"]
    assert 'probe.py", line' in raised["error"]
    assert message["exit_code"] == 1
    assert message["error"].strip().endswith("probe exit message")

    # When the refilled pool runs a @record failure and then a package run with -m
    warm = wait_for_pool(agent, 2)
    start_probe(control_queue, agent, tmp_path, 73, "record")
    recorded = exit_of(control_queue, 73, 0)
    control_queue.send(
        agent.name,
        protocol.AGENT_START_ROUND,
        spec=probe_spec(
            tmp_path, 74, nproc=1, entrypoint=sys.executable, args=["-m", "probepkg", "5", "--x"]
        ),
    )
    module = exit_of(control_queue, 74, 0)

    # Then @record found the rank's error file, and the module ran as `python -m probepkg 5 --x`
    assert {recorded["pid"], module["pid"]} <= set(warm)
    assert recorded["exit_code"] == 1
    assert "KeyError: 'recorded probe failure'" in recorded["error"]
    error_file = tmp_path / "agents" / agent.name / "rounds" / "job-73" / "round-1" / "rank-0" / "error.json"
    assert "recorded probe failure" in error_file.read_text()
    assert module["exit_code"] == 5
    ran = read_json(tmp_path / "out" / "module-0.json")
    assert ran["name"] == "__main__"
    assert ran["package"] == "probepkg"
    assert ran["helper"] == "relative"
    assert ran["argv"] == [str(tmp_path / "code" / "probepkg" / "__main__.py"), "5", "--x"]
    assert ran["path0"] == str(tmp_path / "code")


def test_a_warm_rank_ends_as_the_interpreter_ends_a_script(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent with a full pool of 2 warm interpreters
    agent, _ = start_registered(agent_procs, control_queue, "host-warm-end")
    warm = wait_for_pool(agent, 2)
    write_probe(tmp_path)

    # When one script returns leaving a non-daemon thread, an atexit handler and unflushed
    # stdout behind, and another dies of an uncaught KeyboardInterrupt
    for job_id, mode in ((91, "ending"), (92, "interrupt")):
        start_probe(control_queue, agent, tmp_path, job_id, mode)
    ended, interrupted = exit_of(control_queue, 91, 0), exit_of(control_queue, 92, 0)

    # Then both ran warm; the first exited 0 after its thread finished and its atexit handler ran,
    # with its last line in its log; the second ended by SIGINT after printing its traceback,
    # as `python probe.py` does
    assert {ended["pid"], interrupted["pid"]} == set(warm)
    assert ended["exit_code"] == 0 and ended["signal"] is None
    assert read_json(tmp_path / "out" / "atexit.json") == {"thread_done_before": True}
    stdout = tmp_path / "agents" / agent.name / "rounds" / "job-91" / "round-1" / "rank-0" / "stdout.log"
    assert "unflushed probe line" in stdout.read_text()
    assert interrupted["signal"] == "SIGINT" and interrupted["exit_code"] is None
    assert "KeyboardInterrupt" in interrupted["error"]


def test_sigkill_of_the_agent_leaves_no_warm_process(
    agent_procs: AgentProcs, control_queue: ControlQueue, tmp_path: Path
) -> None:
    # Given an agent running two ranks taken from its pool, and a pool refilled since
    agent, _ = start_registered(agent_procs, control_queue, "host-warm-kill")
    first = wait_for_pool(agent, 2)
    write_probe(tmp_path)
    control_queue.send(
        agent.name,
        protocol.AGENT_START_ROUND,
        spec=probe_spec(tmp_path, 81, nproc=2, entrypoint="probe.py", args=["sleep"]),
    )

    def running(message: ControlMessage) -> bool:
        return len(rank_pids(message, 81, 1)) == 2

    rank = rank_pids(
        control_queue.wait_for(protocol.CONTROL_HEARTBEAT, 60, node=agent.name, match=running), 81, 1
    )
    assert sorted(rank) == sorted(first)
    assert wait_until(lambda: len(warm_pids(agent)) == 2 and not set(warm_pids(agent)) & set(first), 60)
    pids = [*rank, *warm_pids(agent)]
    created = {pid: psutil.Process(pid).create_time() for pid in pids}

    # When the agent is SIGKILLed
    agent.kill()

    # Then the rank and every idle warm interpreter are gone within a few seconds
    assert wait_until(lambda: not any(pid_alive(pid, created[pid]) for pid in pids), 5), [
        pid for pid in pids if pid_alive(pid, created[pid])
    ]
