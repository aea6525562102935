"""Launch overhead: tests/scripts/ddp_train.py (1 node x 2 gloo processes) started through a
Trainyard agent with its warm pool (the default size), through an agent without
one (``--warm-pool 0``: every rank a cold ``python script.py``), and by bare
``torchrun --standalone --nproc-per-node 2``.

For each launcher, RUNS runs (interleaved, rotating which goes first) measure
- time to first step: from the launch (Celery send_task to the agent / Popen of torchrun) to
  the wall-clock time rank 0 logged step 1 in its progress file;
- steps/s: steps per second from the end of the first tenth of the run to the last step, with
  the agent's rate over torchrun's both as a ratio of medians and as the median of the ratios
  within each round (runs of one round follow each other, so slow drift cancels).
Medians are printed, then one JSON line. Before each warm run the bench waits until the pool
is full and done importing (a refill is part of the steady state, not of a launch).

    .venv/bin/python bench/launch_overhead/run.py    # REDIS_URL picks the Redis db (default 2)
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))


from bench import harness  # noqa: E402
from tests.support import procs  # noqa: E402
from tests.support.agents import (  # noqa: E402
    AgentProcess,
    ControlQueue,
    read_progress,
    round_spec,
    wait_pool_ready,
)
from workers import protocol  # noqa: E402
from workers.agent.warmpool import DEFAULT_WARM_POOL  # noqa: E402
from workers.net import free_port  # noqa: E402

RUNS = 9
STEPS = 3000
"""Long enough (several seconds) that the steps/s figure is not at the mercy of one hiccup."""
AGENTS = {"agent": ("bench-launch", DEFAULT_WARM_POOL), "agent-cold": ("bench-launch-cold", 0)}
"""Launcher name -> (agent name, --warm-pool)."""
POOL_READY_TIMEOUT = 120.0
RUN_TIMEOUT = 180.0


def measure(progress: Path, launched_at: float) -> tuple[float, float]:
    steps = [line for line in read_progress(progress) if "step" in line]
    if len(steps) < 2:
        raise RuntimeError(f"no steps logged in {progress}")
    # Steps/s over the steady state: the first tenth of the run includes warm-up.
    steady, last = steps[len(steps) // 10], steps[-1]
    return steps[0]["t"] - launched_at, (last["step"] - steady["step"]) / (last["t"] - steady["t"])


def run_agent_once(
    queue: ControlQueue, agent: AgentProcess, warm_pool: int, work: Path, index: int, job_id: int
) -> tuple[float, float]:
    if warm_pool:
        wait_pool_ready(agent, warm_pool, POOL_READY_TIMEOUT)
    progress = work / f"{agent.name}-{index}.jsonl"
    spec = round_spec(
        job_id=job_id,
        round_=1,
        node_rank=0,
        nnodes=1,
        master_port=free_port(),
        args=["--steps", str(STEPS), "--checkpoint-every", "0", "--progress", str(progress)],
    )
    launched_at = time.time()
    queue.send(agent.name, protocol.AGENT_START_ROUND, spec=spec)
    ended = queue.wait_for(protocol.CONTROL_ROUND_ENDED, RUN_TIMEOUT, node=agent.name, job_id=job_id)
    if ended.kwargs["outcome"] != "succeeded":
        # The same gloo teardown abort as under torchrun (see run_torchrun_once): it happens
        # after the last step, so the launch figures stand.
        steps = [line for line in read_progress(progress) if "step" in line]
        if not steps or steps[-1]["step"] < STEPS:
            raise RuntimeError(f"agent run {index} ended {ended.kwargs}")
        failure = ended.kwargs["failures"][0]
        print(
            f"{agent.name} run {index}: rank {failure['rank']} died in teardown after its last step "
            f"({failure['signal'] or failure['exit_code']})",
            flush=True,
        )
    return measure(progress, launched_at)


def run_torchrun_once(work: Path, index: int) -> tuple[float, float]:
    progress = work / f"torchrun-{index}.jsonl"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO_ROOT / "tests" / "scripts" / "ddp_train.py"),
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        "0",
        "--progress",
        str(progress),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched_at = time.time()
    # Not subprocess.run: interrupted, it kills torchrun alone and leaves its ranks running.
    process = procs.spawn(command, env=env, log=work / f"torchrun-{index}.log")
    try:
        code = process.wait(timeout=RUN_TIMEOUT)
    finally:
        procs.stop(process)
    steps = [line for line in read_progress(progress) if "step" in line]
    if code != 0:
        # Under heavy load a rank sometimes aborts in gloo's teardown after its last step
        # ("terminate called without an active exception"); the launch figures are still valid.
        if not steps or steps[-1]["step"] < STEPS:
            raise RuntimeError(f"torchrun run {index} exited {code}")
        print(f"torchrun run {index} exited {code} after its last step (see its log)", flush=True)
    return measure(progress, launched_at)


def main() -> int:
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/2")
    # No database, no controller: the bench plays the controller on the agents' queues.
    with harness.Bench(
        "launch",
        redis=None,
        django=False,
        env={"REDIS_URL": redis_url, "TRAINYARD_NODE_TOKEN": "bench-token"},
    ) as bench:
        return run_launches(bench, redis_url)


def run_launches(bench: harness.Bench, redis_url: str) -> int:
    work = bench.root
    queue = ControlQueue(redis_url)
    queue.purge()
    agents = {
        launcher: bench.console.agents.start(name, heartbeat=2.0, extra_args=["--warm-pool", str(pool)])
        for launcher, (name, pool) in AGENTS.items()
    }
    launchers = [*AGENTS, "torchrun"]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in launchers}
    job_ids = itertools.count(9000)
    try:
        for agent in agents.values():
            queue.wait_for(protocol.CONTROL_REGISTER, 60, node=agent.name)
        for index in range(RUNS):
            # Rotate which launcher goes first, so a drift in background load (this machine is
            # shared) does not always favour the same one.
            shift = index % len(launchers)
            for launcher in launchers[shift:] + launchers[:shift]:
                if launcher == "torchrun":
                    results[launcher].append(run_torchrun_once(work, index))
                else:
                    pool = AGENTS[launcher][1]
                    results[launcher].append(
                        run_agent_once(queue, agents[launcher], pool, work, index, next(job_ids))
                    )
            print(
                f"run {index + 1}/{RUNS}: "
                + "; ".join(
                    f"{name} {results[name][-1][0]:.2f} s to first step, {results[name][-1][1]:.0f} steps/s"
                    for name in launchers
                ),
                flush=True,
            )
    finally:
        for agent in agents.values():
            agent.stop()
        queue.purge()
        queue.close()
    medians = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    figures = {
        "agent_first_step_s": round(medians["agent"][0], 3),
        "agent_cold_first_step_s": round(medians["agent-cold"][0], 3),
        "torchrun_first_step_s": round(medians["torchrun"][0], 3),
        "first_step_ratio": round(medians["agent"][0] / medians["torchrun"][0], 3),
        "cold_first_step_ratio": round(medians["agent-cold"][0] / medians["torchrun"][0], 3),
        "agent_steps_per_s": round(medians["agent"][1], 1),
        "agent_cold_steps_per_s": round(medians["agent-cold"][1], 1),
        "torchrun_steps_per_s": round(medians["torchrun"][1], 1),
        "steps_per_s_ratio": round(medians["agent"][1] / medians["torchrun"][1], 3),
        # Each run's agent rate over torchrun's in the same round: the machine's drift from round
        # to round (it is shared) cancels out of these, so their median is the steadier figure.
        "steps_per_s_paired_ratio": round(
            statistics.median(
                a[1] / t[1] for a, t in zip(results["agent"], results["torchrun"], strict=True)
            ),
            3,
        ),
    }
    print()
    print(f"launch overhead, ddp_train.py 1 node x 2 gloo processes, {STEPS} steps, median of {RUNS} runs")
    print(f"agent = --warm-pool {DEFAULT_WARM_POOL} (default), agent-cold = --warm-pool 0")
    print(f"{'launcher':<11} {'launch -> first step (s)':>26} {'vs torchrun':>12} {'steps/s':>10}")
    for name, (first_step, rate) in medians.items():
        ratio = first_step / medians["torchrun"][0]
        print(f"{name:<11} {first_step:>26.2f} {ratio:>12.3f} {rate:>10.1f}")
    print(
        f"steps/s agent vs torchrun: ratio of medians {figures['steps_per_s_ratio']:.3f}, "
        f"median of per-round ratios {figures['steps_per_s_paired_ratio']:.3f}"
    )
    harness.print_json(figures)
    return 0


if __name__ == "__main__":
    # SIGTERM and Ctrl-C unwind main(); the agents and any torchrun are stopped on the way out.
    sys.exit(harness.run(main))
