"""SDK metrics: records in the protocol's format, flushed without asking, model statistics, NaN
events, a quiet console line outside Trainyard, and a checkpoint on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.test_workload_digits import REPO

TRAINING_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    from torch import nn
    from workers import sdk

    steps, nan_at = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watcher = sdk.watch(model, every=5, optimizer=optimizer)
    for step in range(1, steps + 1):
        with sdk.step(step, samples=32, tokens=320):
            x = torch.randn(32, 8)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            loss.backward()
            if step == nan_at:
                model[2].weight.grad[0, 3] = float("nan")
            watcher.after_backward(step)
            optimizer.step()
            optimizer.zero_grad()
        sdk.log(step, loss=loss, lr=0.05)
    print("trained", flush=True)
    time.sleep(float(sys.argv[3]))
    """
)


def _run(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=REPO,
        env={**base, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_statistics_and_gradient_anomalies_while_the_script_runs(tmp_path: Path) -> None:
    path = tmp_path / "telemetry-{rank}.jsonl"
    written = tmp_path / "telemetry-0.jsonl"
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env = {**base, "OMP_NUM_THREADS": "1", "TRAINYARD_TELEMETRY": str(path), "RANK": "0"}
    # The script sleeps after training: its records must reach the file without an exit flush.
    proc = subprocess.Popen(
        [sys.executable, str(script), "20", "15", "60"], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "trained\n"
        trained_at = time.monotonic()
        while not (written.exists() and '"step":20,"values":{"loss"' in written.read_text()):
            assert time.monotonic() - trained_at < 2.0, "records not flushed while the process runs"
            time.sleep(0.05)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert out == ""  # inside the console nothing is printed
    records = _read(written)
    metrics = [r for r in records if r["kind"] == "metric"]
    assert [r["seq"] for r in metrics] == list(range(1, len(metrics) + 1))
    assert all(set(r) == {"kind", "seq", "t", "step", "values"} for r in metrics)

    losses = [(r["step"], r["values"]["loss"]) for r in metrics if "loss" in r["values"]]
    assert [s for s, _ in losses] == list(range(1, 21))
    # The NaN gradient of step 15 poisons the weights: later losses are NaN, logged as null.
    assert all(loss is not None for s, loss in losses if s <= 15)
    assert all(loss is None for s, loss in losses if s > 15)
    assert losses[14][1] < losses[0][1]

    watched = {r["step"]: r["values"] for r in metrics if "grad_norm" in r["values"]}
    assert sorted(watched) == [5, 10, 15, 20]
    assert set(watched[5]) == {"grad_norm", "grad_norm/0", "grad_norm/2", "param_norm"}
    layers = (watched[5]["grad_norm/0"] ** 2 + watched[5]["grad_norm/2"] ** 2) ** 0.5
    assert abs(layers - watched[5]["grad_norm"]) < 1e-4 * watched[5]["grad_norm"]
    ratios = [r["values"]["update_ratio"] for r in metrics if "update_ratio" in r["values"]]
    assert 0 < ratios[0] < 1

    timing = [r for r in metrics if "step_time_s" in r["values"]]
    assert [r["step"] for r in timing] == [1, 10, 20]
    values = timing[1]["values"]
    assert abs(values["samples_per_s"] * values["step_time_s"] - 32) < 1e-6
    assert abs(values["tokens_per_s"] * values["step_time_s"] - 320) < 1e-6
    assert values["peak_memory_bytes"] > 10_000_000

    anomalies = [r for r in records if r["kind"] == "event"]
    assert anomalies[0]["event"] == "gradient_anomaly" and anomalies[0]["seq"] == 1
    assert anomalies[0]["data"]["step"] == 15 and anomalies[0]["data"]["layer"] == "2"
    assert "layer 2 at step 15" in anomalies[0]["message"]


def test_outside_the_console_a_line_is_printed_every_n_steps(tmp_path: Path) -> None:
    printed = _run(tmp_path, ["20", "-1", "0"], {"TRAINYARD_PRINT_EVERY": "10"})
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert [line.split("]")[0] for line in lines[:-1]] == ["[step 10", "[step 20"]
    assert "loss " in lines[0] and "samples_per_s" in lines[0] and "grad_norm" in lines[0]
    assert not list(tmp_path.glob("*.jsonl"))


STOP_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    from workers import sdk

    weights = torch.zeros(4)
    step = 0
    while True:
        step += 1
        weights += 1
        if step == 3:
            print("running", flush=True)
        if sdk.should_stop(step):
            sdk.save({"weights": weights, "step": step}, step)
            print(f"saved {step}", flush=True)
            break
        time.sleep(0.01)
    """
)


def test_sigterm_lets_a_plain_script_checkpoint_before_exiting(tmp_path: Path) -> None:
    script = tmp_path / "stop.py"
    script.write_text(STOP_SCRIPT)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env = {
        **base,
        "TRAINYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "TRAINYARD_TELEMETRY": str(tmp_path / "t.jsonl"),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "running\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    step = int(out.split()[-1])
    from workers import sdk

    loaded = sdk.load_latest(tmp_path / "ckpt")
    assert loaded is not None and loaded[1] == step
    assert loaded[0]["weights"].tolist() == [float(step)] * 4
    [record] = [r for r in _read(tmp_path / "t.jsonl") if r["kind"] == "checkpoint"]
    assert record["step"] == step and record["size_bytes"] > 0
