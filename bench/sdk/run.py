"""SDK cost: overhead on the digits workload's step, and asynchronous checkpoint blocking time.

    .venv/bin/python bench/sdk/run.py [--pairs 61] [--steps 200] [--reps 5]

1. Overhead: the digits-mlp training step (its model, data, Adam, clipping; one process, CPU),
   run as ``pairs`` interleaved pairs of ``steps``-step runs, one without SDK calls and one with
   the SDK calls the digits workload makes: ``with sdk.step(...)`` and ``sdk.should_stop(step)``
   every step, ``watcher.after_backward`` (statistics every 100 steps) and ``sdk.log(step,
   loss=...)`` every 10 steps (the workload's defaults), telemetry written to a file as inside
   the console. The overhead is the median over pairs of (mean CPU time per step with / without
   - 1), as a percentage; in the same run the plain step runs twice per pair, and the same statistic
   between those two is the noise floor (``noise_floor_percent``). Then each call alone (CPU time, including the telemetry thread's
   serialising), so a script that logs every step can work out its own cost.
2. Checkpoints: a 134 MB model state (two 4096x4096 fp32 layers). Plain ``torch.save`` to a
   file against ``AsyncCheckpointer.save`` (the time the training loop is blocked: the copy into
   host buffers); medians of ``reps`` saves, the asynchronous one in steady state (buffers
   allocated by a first save that is reported apart).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# The digits workload's default log_every.
LOG_EVERY = 10
TELEMETRY_DIR = Path(tempfile.mkdtemp(prefix="trainyard-bench-sdk-"))
# Before the SDK is imported: it reads the environment on first use.
os.environ["TRAINYARD_TELEMETRY"] = str(TELEMETRY_DIR / "telemetry.jsonl")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from workers import sdk  # noqa: E402
from workers.workloads.catalog import validate_hyperparameters  # noqa: E402
from workers.workloads.common import Runtime  # noqa: E402
from workers.workloads.digits import DigitsTask  # noqa: E402


def digits_run(
    task: DigitsTask,
    optimizer: torch.optim.Optimizer,
    watcher: sdk.Watcher | None,
    steps: int,
    first: int,
    log_every: int = LOG_EVERY,
) -> float:
    """Runs ``steps`` steps, with the SDK calls when ``watcher`` is given; returns the mean step time.

    Process CPU time, not wall time: other work on a shared machine then barely moves it, and the
    telemetry thread's CPU is counted with the step. The mean, not the median: the watcher's
    statistics every 100 steps are part of the cost.
    """
    model = task.model
    batches = [task.batch(first + i, 0) for i in range(steps)]
    started = time.process_time()
    for offset in range(steps):
        step = first + offset
        if watcher is not None:
            with sdk.step(step, samples=64):
                loss = task.loss(model, batches[offset])
                loss.backward()
                watcher.after_backward(step)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if step % log_every == 0:
                sdk.log(step, loss=loss.detach())
            sdk.should_stop(step)
        else:
            loss = task.loss(model, batches[offset])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if watcher is not None:
        sdk.flush()  # the serialising this run caused is charged to it
    return (time.process_time() - started) / steps


def measure_overhead(pairs: int, steps: int) -> tuple[float, float, float, float]:
    """(plain step, step with the SDK, overhead %, noise floor %). Each pair runs the plain step
    twice and the SDK's once between them; the noise floor is the same statistic between the
    two plain runs (what the machine's load alone moves it by)."""
    hp = validate_hyperparameters("digits-mlp", {})
    runtime = Runtime(0, 0, 1, torch.device("cpu"), False, "fp32", 1)
    task = DigitsTask(hp, runtime)
    optimizer = torch.optim.Adam(task.model.parameters(), lr=hp["lr"])
    watcher = sdk.watch(task.model, every=hp["watch_every"], optimizer=optimizer)
    digits_run(task, optimizer, watcher, steps, 1)  # warm-up: allocator, telemetry thread
    digits_run(task, optimizer, None, steps, 1)
    plain, with_sdk, ratios, noise = [], [], [], []
    first = 1
    for pair in range(pairs):
        # Alternate the order so drift in machine load hits both sides alike; the ratio within a
        # pair (runs a fraction of a second apart) cancels slower changes of the load.
        order = ("plain", "sdk", "again") if pair % 2 == 0 else ("again", "sdk", "plain")
        means = {}
        for run in order:
            means[run] = digits_run(task, optimizer, watcher if run == "sdk" else None, steps, first)
            first += steps
        plain.append(means["plain"])
        with_sdk.append(means["sdk"])
        ratios.append(means["sdk"] / means["plain"])
        noise.append(means["again"] / means["plain"])
    return (
        statistics.median(plain),
        statistics.median(with_sdk),
        (statistics.median(ratios) - 1) * 100,
        (statistics.median(noise) - 1) * 100,
    )


def measure_call_costs(steps: int = 20000, reps: int = 3) -> dict[str, float]:
    """CPU microseconds per call of each SDK call alone (telemetry thread's work included)."""
    hp = validate_hyperparameters("digits-mlp", {})
    task = DigitsTask(hp, Runtime(0, 0, 1, torch.device("cpu"), False, "fp32", 1))
    optimizer = torch.optim.Adam(task.model.parameters(), lr=hp["lr"])
    task.loss(task.model, task.batch(1, 0)).backward()
    watcher = sdk.watch(task.model, every=hp["watch_every"], optimizer=optimizer)
    loss = torch.tensor(0.5)

    def timed_step(step: int) -> None:
        with sdk.step(step, samples=64):
            pass

    def watched(step: int) -> None:
        watcher.after_backward(step)
        if step % watcher.every == 0:
            watcher.after_step()  # what the optimizer hook runs after a measured step

    calls: dict[str, Callable[[int], object]] = {
        "with sdk.step(...)": timed_step,
        "sdk.log(step, loss=<tensor>)": lambda step: sdk.log(step, loss=loss),
        "sdk.log(step, loss=<float>)": lambda step: sdk.log(step, loss=0.5),
        "sdk.should_stop(step)": sdk.should_stop,
        "watcher (every 100, amortised)": watched,
    }
    costs = {}
    for name, call in calls.items():
        samples = []
        for rep in range(reps):
            started = time.process_time()
            for step in range(rep * steps + 1, (rep + 1) * steps + 1):
                call(step)
            sdk.flush()
            samples.append((time.process_time() - started) / steps * 1e6)
        costs[name] = statistics.median(samples)
    return costs


def big_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096))
    return model.state_dict()


def measure_checkpoints(reps: int, directory: Path) -> dict[str, float]:
    state = big_state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    plain = []
    for rep in range(reps):
        path = directory / f"plain-{rep}.pt"
        started = time.perf_counter()
        torch.save(state, path)
        plain.append(time.perf_counter() - started)
        path.unlink()
    atomic = []
    for rep in range(reps):
        started = time.perf_counter()
        sdk.save(state, rep, directory=directory / "sync", keep=1)
        atomic.append(time.perf_counter() - started)
    checkpointer = sdk.AsyncCheckpointer(directory / "async", keep=1)
    checkpointer.save(state, 0)
    first_async = checkpointer.last_blocking_ms
    checkpointer.wait()
    blocking = []
    for rep in range(1, reps + 1):
        with torch.no_grad():
            for tensor in state.values():
                tensor.add_(1.0)  # the model moves on between checkpoints
        checkpointer.save(state, rep)
        blocking.append(checkpointer.last_blocking_ms)
        checkpointer.wait()
    return {
        "state_mb": size / 1e6,
        "torch_save_ms": statistics.median(plain) * 1000,
        "atomic_save_ms": statistics.median(atomic) * 1000,
        "async_first_blocking_ms": first_async,
        "async_blocking_ms": statistics.median(blocking),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=61)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    base, instrumented, overhead, noise = measure_overhead(args.pairs, args.steps)
    costs = measure_call_costs()
    workload_calls = (
        costs["with sdk.step(...)"]
        + costs["sdk.should_stop(step)"]
        + costs["watcher (every 100, amortised)"]
        + costs["sdk.log(step, loss=<tensor>)"] / LOG_EVERY
    )
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-ckpt-", dir=TELEMETRY_DIR) as scratch:
        checkpoints = measure_checkpoints(args.reps, Path(scratch))
    sdk.flush()
    shutil.rmtree(TELEMETRY_DIR, ignore_errors=True)
    ratio = checkpoints["async_blocking_ms"] / checkpoints["torch_save_ms"]

    print(f"SDK overhead, digits-mlp step (1 process, CPU time), {args.pairs} pairs x {args.steps} steps")
    print(f"  {'step without SDK (median of means)':<34}{base * 1e6:>10.1f} us")
    print(f"  {'step with SDK calls':<34}{instrumented * 1e6:>10.1f} us")
    print(f"  {'overhead (median of pair ratios)':<34}{overhead:>10.2f} %")
    print(f"  {'noise floor (plain vs plain)':<34}{noise:>10.2f} %   load {os.getloadavg()[0]:.1f}")
    print("SDK calls alone, CPU us per call (medians)")
    for name, cost in costs.items():
        print(f"  {name:<34}{cost:>10.2f} us")
    print(f"  {'the workload pattern, per step':<34}{workload_calls:>10.2f} us")
    print(f"  {'  as share of the plain step':<34}{workload_calls / (base * 1e6) * 100:>10.2f} %")
    print(f"Checkpoint of a {checkpoints['state_mb']:.0f} MB state, medians of {args.reps}")
    print(f"  {'torch.save (plain)':<34}{checkpoints['torch_save_ms']:>10.1f} ms")
    print(f"  {'sdk.save (atomic, fsync)':<34}{checkpoints['atomic_save_ms']:>10.1f} ms")
    print(
        f"  {'async save, first (allocates)':<34}{checkpoints['async_first_blocking_ms']:>10.1f} ms blocked"
    )
    print(f"  {'async save, steady state':<34}{checkpoints['async_blocking_ms']:>10.1f} ms blocked")
    print(f"  {'async / torch.save':<34}{ratio:>10.3f}")
    print(
        json.dumps(
            {
                "sdk_overhead_percent": round(overhead, 3),
                "noise_floor_percent": round(noise, 3),
                "step_us_without_sdk": round(base * 1e6, 1),
                "step_us_with_sdk": round(instrumented * 1e6, 1),
                "sdk_calls_us_per_step": round(workload_calls, 2),
                "sdk_calls_percent": round(workload_calls / (base * 1e6) * 100, 3),
                "sdk_log_us": round(costs["sdk.log(step, loss=<tensor>)"], 2),
                "torch_save_ms": round(checkpoints["torch_save_ms"], 1),
                "atomic_save_ms": round(checkpoints["atomic_save_ms"], 1),
                "async_first_blocking_ms": round(checkpoints["async_first_blocking_ms"], 1),
                "async_blocking_ms": round(checkpoints["async_blocking_ms"], 1),
                "async_blocking_ratio": round(ratio, 4),
                "state_mb": round(checkpoints["state_mb"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
