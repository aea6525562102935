"""torchrun's side of the elastic bench: the same plain script under ``torchrun --standalone``
(rank kill) and the c10d rendezvous (scale-up, node kill), for comparison (bench/elastic/run.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.elastic.common import (
    DDP_SCRIPT,
    REPO,
    TORCHRUN_WAIT,
    TRAINED_STEPS,
    ddp_args,
    first_step_after,
    script_pids,
    wait_steps,
)
from tests.support import procs
from workers.net import free_port

TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""torchrun's documented opt-out of sharing its rendezvous TCPStore with the workers. Shared (the
default in torch 2.13), the store outlives a restart with the previous attempt's gloo keys still in
it, and a restarted rank may read its dead peer's address: ``connectFullMesh ... Connection
refused``, and the restart fails (torchrun recovered in 1 of 5 reps that way). Opted out, rank 0 of
each attempt hosts a fresh store and torchrun recovered in every rep tried (4 of 4)."""


def torchrun(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return procs.spawn(
        [str(Path(sys.executable).parent / "torchrun"), *args],
        cwd=REPO,
        env={**os.environ, **TORCHRUN_ENV},
        log=log,
    )


def torchrun_rank_kill(work: Path) -> float | None:
    progress = work / "progress.jsonl"
    proc = torchrun(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            str(DDP_SCRIPT),
            *ddp_args(progress),
            "--checkpoint-dir",
            str(work / "ckpt"),
        ],
        work / "torchrun.log",
    )
    try:
        if not wait_steps(progress, 2, TRAINED_STEPS):
            return None
        victim = script_pids(proc.pid)[-1]
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        return first_step_after(progress, t0, timeout=TORCHRUN_WAIT)
    finally:
        procs.kill(proc)


def torchrun_c10d(work: Path, node: int, port: int, progress: Path) -> subprocess.Popen[bytes]:
    return torchrun(
        [
            "--nnodes",
            "2:3",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            work.name,
            "--max-restarts",
            "3",
            str(DDP_SCRIPT),
            *ddp_args(progress),
            "--checkpoint-dir",
            str(work / "ckpt"),
        ],
        work / f"torchrun-{node}.log",
    )


def torchrun_scale_up(work: Path) -> float | None:
    progress, port = work / "progress.jsonl", free_port()
    started = [torchrun_c10d(work, n, port, progress) for n in range(2)]
    try:
        if not wait_steps(progress, 2, TRAINED_STEPS):
            return None
        t0 = time.time()
        started.append(torchrun_c10d(work, 2, port, progress))
        return first_step_after(progress, t0, world=3, timeout=TORCHRUN_WAIT)
    finally:
        for proc in started:
            procs.kill(proc)


def torchrun_node_kill(work: Path) -> float | None:
    progress, port = work / "progress.jsonl", free_port()
    started = [torchrun_c10d(work, n, port, progress) for n in range(3)]
    try:
        if not wait_steps(progress, 3, TRAINED_STEPS, timeout=120):
            return None
        t0 = time.time()
        procs.kill(started[2])  # the host dies: its agent and its rank
        return first_step_after(progress, t0, world=2, timeout=TORCHRUN_WAIT)
    finally:
        for proc in started:
            procs.kill(proc)
