"""Launch overhead: tests/scripts/ddp_train.py (1 node x 2 gloo processes) started through a
Trainyard agent versus bare ``torchrun --standalone --nproc-per-node 2``.

For each launcher, RUNS runs (interleaved, alternating which goes first) measure
- time to first step: from the launch (Celery send_task to the agent / Popen of torchrun) to
  the wall-clock time rank 0 logged step 1 in its progress file;
- steps/s: steps per second from the end of the first tenth of the run to the last step.
Medians are printed, then one JSON line.

    .venv/bin/python bench/launch_overhead/run.py    # REDIS_URL picks the Redis db (default 2)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.agents import (  # noqa: E402
    ControlQueue,
    free_port,
    read_progress,
    round_spec,
    start_agent,
)
from workers import protocol  # noqa: E402

RUNS = 5
STEPS = 2000
"""Long enough (several seconds) that the steps/s figure is not at the mercy of one hiccup."""
AGENT_NAME = "bench-launch"
RUN_TIMEOUT = 180.0


def measure(progress: Path, launched_at: float) -> tuple[float, float]:
    steps = [line for line in read_progress(progress) if "step" in line]
    if len(steps) < 2:
        raise RuntimeError(f"no steps logged in {progress}")
    # Steps/s over the steady state: the first tenth of the run includes warm-up.
    steady, last = steps[len(steps) // 10], steps[-1]
    return steps[0]["t"] - launched_at, (last["step"] - steady["step"]) / (last["t"] - steady["t"])


def run_agent_once(queue: ControlQueue, work: Path, index: int) -> tuple[float, float]:
    progress = work / f"agent-{index}.jsonl"
    spec = round_spec(
        job_id=9000 + index,
        round_=1,
        node_rank=0,
        nnodes=1,
        master_port=free_port(),
        args=["--steps", str(STEPS), "--checkpoint-every", "0", "--progress", str(progress)],
    )
    launched_at = time.time()
    queue.send(AGENT_NAME, protocol.AGENT_START_ROUND, spec=spec)
    ended = queue.wait_for(protocol.CONTROL_ROUND_ENDED, RUN_TIMEOUT, node=AGENT_NAME, job_id=9000 + index)
    if ended.kwargs["outcome"] != "succeeded":
        raise RuntimeError(f"agent run {index} ended {ended.kwargs}")
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
    with (work / f"torchrun-{index}.log").open("wb") as log:
        launched_at = time.time()
        code = subprocess.run(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT
        ).returncode
    if code != 0:
        raise RuntimeError(f"torchrun run {index} exited {code}")
    return measure(progress, launched_at)


def main() -> int:
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/2")
    work = Path(tempfile.mkdtemp(prefix="trainyard-launch-bench-"))
    queue = ControlQueue(redis_url)
    queue.purge()
    agent = start_agent(
        AGENT_NAME,
        redis_url,
        token="bench-token",
        data_dir=work / "agents" / AGENT_NAME,
        checkpoint_root=work / "checkpoints",
        heartbeat=2.0,
    )
    results: dict[str, list[tuple[float, float]]] = {"agent": [], "torchrun": []}
    try:
        queue.wait_for(protocol.CONTROL_REGISTER, 60, node=AGENT_NAME)
        for index in range(RUNS):
            # Alternate which launcher goes first, so a drift in background load (this machine
            # is shared) does not always favour the same one.
            if index % 2 == 0:
                results["agent"].append(run_agent_once(queue, work, index))
                results["torchrun"].append(run_torchrun_once(work, index))
            else:
                results["torchrun"].append(run_torchrun_once(work, index))
                results["agent"].append(run_agent_once(queue, work, index))
            print(
                f"run {index + 1}/{RUNS}: agent {results['agent'][-1][0]:.2f} s to first step,"
                f" {results['agent'][-1][1]:.0f} steps/s; torchrun {results['torchrun'][-1][0]:.2f} s,"
                f" {results['torchrun'][-1][1]:.0f} steps/s",
                flush=True,
            )
    finally:
        agent.stop()
        queue.purge()
        queue.close()
    medians = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    figures = {
        "agent_first_step_s": round(medians["agent"][0], 3),
        "torchrun_first_step_s": round(medians["torchrun"][0], 3),
        "first_step_ratio": round(medians["agent"][0] / medians["torchrun"][0], 3),
        "agent_steps_per_s": round(medians["agent"][1], 1),
        "torchrun_steps_per_s": round(medians["torchrun"][1], 1),
        "steps_per_s_ratio": round(medians["agent"][1] / medians["torchrun"][1], 3),
    }
    print()
    print(f"launch overhead, ddp_train.py 1 node x 2 gloo processes, {STEPS} steps, median of {RUNS} runs")
    print(f"{'launcher':<10} {'launch -> first step (s)':>26} {'steps/s':>10}")
    for name, (first_step, rate) in medians.items():
        print(f"{name:<10} {first_step:>26.2f} {rate:>10.1f}")
    print(f"{'ratio':<10} {figures['first_step_ratio']:>26.3f} {figures['steps_per_s_ratio']:>10.3f}")
    print(json.dumps(figures))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
