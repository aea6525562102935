"""Fixtures for PS-job tests: real coordinator, PS and worker processes on localhost."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.ps.local import LocalPsJob

COUNT_WORKER = str(Path(__file__).resolve().parents[1] / "scripts" / "ps_count_worker.py")
HYBRID_WORKER = str(Path(__file__).resolve().parents[1] / "scripts" / "ps_hybrid_worker.py")


@pytest.fixture
def ps_job(tmp_path: Path) -> Iterator[Callable[..., LocalPsJob]]:
    """Makes LocalPsJobs under tmp_path; stops every process they started, even on failure."""
    jobs: list[LocalPsJob] = []

    def make(**kwargs: Any) -> LocalPsJob:
        job = LocalPsJob(tmp_path / f"job-{len(jobs)}", **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, job: LocalPsJob | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}\n{job.log(name)[-2000:]}" for name in job.processes) if job else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")
        time.sleep(0.1)


def count_worker_argv(
    summary: Path, examples: int, shard_size: int, batch_size: int, *extra: str
) -> list[str]:
    return [
        COUNT_WORKER,
        str(summary),
        "--examples",
        str(examples),
        "--shard-size",
        str(shard_size),
        "--batch-size",
        str(batch_size),
        *extra,
    ]


def telemetry(job: LocalPsJob, role: str, index: int) -> list[dict[str, Any]]:
    path = job.workdir / f"telemetry-{role}-{index}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
