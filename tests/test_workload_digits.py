"""digits-mlp under 2-process gloo: learns, resumes, accumulates gradients, runs bf16, stops on SIGTERM.

The ranks are started here the way the agent starts them (torchrun's environment contract, one
process per rank in its own session); ``RankGroup`` is shared by the other workload tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import torch

from workers.net import free_port

REPO = Path(__file__).resolve().parent.parent


class RankGroup:
    """Starts ``nproc`` ranks of ``python -m <module> args``; stops every one of them on exit."""

    def __init__(
        self,
        workdir: Path,
        argv: list[str],
        nproc: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.argv = argv
        self.nproc = nproc
        self.extra_env = env or {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.checkpoints = workdir / "checkpoints"

    def telemetry(self, rank: int) -> Path:
        return self.workdir / f"telemetry-{rank}.jsonl"

    def output(self, rank: int) -> Path:
        return self.workdir / f"rank-{rank}.out"

    def __enter__(self) -> RankGroup:
        return self

    def start(self) -> RankGroup:
        port = free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.nproc):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(self.nproc),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(self.nproc),
                "GROUP_RANK": "0",
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(self.nproc),
                "ROLE_NAME": "default",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_RUN_ID": "test",
                "TRAINYARD_TELEMETRY": str(self.telemetry(rank)),
                "TRAINYARD_CHECKPOINT_DIR": str(self.checkpoints),
                **self.extra_env,
            }
            with open(self.output(rank), "ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, *self.argv],
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return self

    def wait(self, timeout: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        self.procs = []
        return codes

    def signal(self, signum: int) -> None:
        for proc in self.procs:
            os.kill(proc.pid, signum)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs = []

    def text(self, rank: int = 0) -> str:
        return self.output(rank).read_text(errors="replace")

    def records(self, kind: str, rank: int = 0) -> list[dict[str, Any]]:
        path = self.telemetry(rank)
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in lines if r["kind"] == kind]

    def series(self, name: str, rank: int = 0) -> list[tuple[int, float]]:
        return [(r["step"], r["values"][name]) for r in self.records("metric", rank) if name in r["values"]]


def workload(name: str, *overrides: str) -> list[str]:
    sets = [arg for pair in overrides for arg in ("--set", pair)]
    return ["-m", "workers.workloads", name, *sets]


def assert_learns(group: RankGroup, name: str = "loss", factor: float = 0.8) -> list[tuple[int, float]]:
    series = group.series(name)
    assert len(series) >= 3, group.text()
    first, last = series[0][1], series[-1][1]
    assert last < first * factor, f"{name} did not go down: {series}"
    return series


def test_digits_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    with RankGroup(
        tmp_path, workload("digits-mlp", "steps=60", "log_every=10", "checkpoint_every=20", "watch_every=25")
    ) as group:
        assert group.start().wait() == [0, 0], group.text()
        losses = assert_learns(group, factor=0.5)
        assert [step for step, _ in losses] == [1, 10, 20, 30, 40, 50, 60]
        accuracy = group.series("accuracy")
        assert accuracy[-1][1] > 0.8 and accuracy[-1][1] > accuracy[0][1]
        # Rank 1 reports its own step times but not the (global) loss, which rank 0 logs.
        assert group.series("step_time_s", rank=1) and not group.series("loss", rank=1)
        assert [step for step, _ in group.series("grad_norm")] == [25, 50]
        assert [step for step, _ in group.series("update_ratio")] == [25, 50]
        saved = sorted(p.name for p in group.checkpoints.iterdir())
        assert saved == ["step-000000020.pt", "step-000000040.pt", "step-000000060.pt"]
        recorded = [r["step"] for r in group.records("checkpoint")]
        assert recorded == [20, 40, 60]
        final = torch.load(group.checkpoints / "step-000000060.pt", weights_only=True)
        assert final["step"] == 60 and final["hyperparameters"]["steps"] == 60

        resumed = RankGroup(tmp_path, workload("digits-mlp", "steps=70", "log_every=10"))
        with resumed:
            assert resumed.start().wait() == [0, 0], resumed.text()
        assert "resumed from the checkpoint of step 60" in resumed.text()
        later = [step for step, _ in group.series("loss") if step > 60]
        assert later == [61, 70]
        # The resumed model starts where the first run ended, not from scratch.
        assert group.series("loss")[-2][1] < losses[0][1] * 0.5


def test_digits_with_gradient_accumulation_and_bf16(tmp_path: Path) -> None:
    env = {"TRAINYARD_PRECISION": "bf16", "TRAINYARD_GRAD_ACCUM_STEPS": "2"}
    argv = workload("digits-mlp", "steps=30", "log_every=10", "checkpoint_every=0", "batch_size=32")
    with RankGroup(tmp_path, argv, env=env) as group:
        assert group.start().wait() == [0, 0], group.text()
        assert_learns(group, factor=0.7)
        # Two micro-batches of 32 on each of two ranks: 128 samples per optimizer step.
        first = next(r["values"] for r in group.records("metric") if "samples_per_s" in r["values"])
        assert first["samples_per_s"] * first["step_time_s"] == pytest.approx(128)


def test_digits_refuses_fp16_on_cpu_and_unknown_hyperparameters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.workloads.__main__ import main

    monkeypatch.setenv("TRAINYARD_PRECISION", "fp16")
    assert main(["digits-mlp", "--set", "steps=2"]) == 2
    assert "fp16 needs a GPU" in capsys.readouterr().err
    monkeypatch.setenv("TRAINYARD_PRECISION", "fp32")
    assert main(["digits-mlp", "--set", "learning_rate=0.1"]) == 2
    assert "unknown hyperparameter for digits-mlp: learning_rate" in capsys.readouterr().err
    monkeypatch.setenv("TRAINYARD_HYPERPARAMETERS", '{"steps": "many"}')
    assert main(["digits-mlp"]) == 2
    assert "hyperparameter 'steps' must be int, got str 'many'" in capsys.readouterr().err


def test_digits_refuses_another_workloads_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers import sdk
    from workers.workloads.__main__ import main

    sdk.save({"workload": "tiny-lm", "model": {}, "optimizers": []}, 7, directory=tmp_path)
    monkeypatch.setenv("TRAINYARD_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["digits-mlp", "--set", "steps=9"]) == 2
    assert "holds a 'tiny-lm' checkpoint (step 7), not 'digits-mlp'" in capsys.readouterr().err


def test_sigterm_makes_the_ranks_checkpoint_and_exit(tmp_path: Path) -> None:
    argv = workload("digits-mlp", "steps=100000", "log_every=10", "checkpoint_every=0")
    with RankGroup(tmp_path, argv) as group:
        group.start()
        deadline = time.monotonic() + 90
        while not [s for s, _ in group.series("loss") if s >= 20]:
            assert time.monotonic() < deadline, group.text()
            assert all(p.poll() is None for p in group.procs), group.text()
            time.sleep(0.2)
        group.signal(signal.SIGTERM)
        assert group.wait(timeout=60) == [0, 0], group.text()
        checkpoints = group.records("checkpoint")
        assert len(checkpoints) == 1
        step = checkpoints[0]["step"]
        assert step >= 20 and step % 10 == 0  # ranks agree on stopping every 10 steps
        assert f"stopped at step {step}" in group.text()
        state = torch.load(group.checkpoints / f"step-{step:09d}.pt", weights_only=True)
        assert state["step"] == step
