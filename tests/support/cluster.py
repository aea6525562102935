"""A whole Trainyard cluster for end-to-end tests: a real controller and N real agents.

The test process plays the web tier: it calls the REST API in-process (DRF test client)
against the same PostgreSQL test database the controller uses. Every process started here is
stopped in teardown (agents and their ranks by pid, the controller by process group).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from console.core.states import JobState
from console.jobs.models import Job
from tests.support.agents import DDP_SCRIPT, AgentProcess, AgentProcs
from tests.support.controller import Controller, wait_for

HEARTBEAT = 1.0


@dataclass
class Cluster:
    controller: Controller
    agents: AgentProcs
    api: APIClient
    root: Path

    def start_agents(self, *names: str) -> list[AgentProcess]:
        started = [self.agents.start(name, heartbeat=HEARTBEAT) for name in names]
        from console.cluster.models import Node

        wait_for(
            lambda: Node.objects.filter(name__in=names, state="ONLINE").count() == len(names),
            timeout=60,
            message=f"agents {names} to register",
        )
        return started

    def agent(self, name: str) -> AgentProcess:
        return next(a for a in self.agents.agents if a.name == name)

    def submit_ddp(
        self,
        *,
        nnodes: str,
        steps: int,
        step_sleep: float = 0.05,
        extra_args: list[str] | None = None,
        **spec: Any,
    ) -> Job:
        progress = self.root / f"progress-{len(list(self.root.glob('progress-*')))}.jsonl"
        body = {
            "name": "ddp-e2e",
            "entrypoint": str(DDP_SCRIPT),
            "workdir": str(DDP_SCRIPT.parent),
            "args": [
                "--steps",
                str(steps),
                "--step-sleep",
                str(step_sleep),
                "--checkpoint-every",
                "5",
                "--progress",
                str(progress),
                *(extra_args or []),
            ],
            "nnodes": nnodes,
            "nproc_per_node": 1,
            "grace_period": 10,
            **spec,
        }
        response = self.api.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        job.progress_file = progress  # type: ignore[attr-defined]
        return job

    def progress(self, job: Job) -> list[dict[str, Any]]:
        path: Path | None = getattr(job, "progress_file", None)  # submit_ddp's jobs only
        if path is None or not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_steps(self, job: Job, *, world: int, count: int = 3, timeout: float = 90) -> dict[str, Any]:
        """Wait until ``count`` steps were taken at world size ``world``; returns the first one."""

        def seen() -> dict[str, Any] | None:
            at_world = [r for r in self.progress(job) if "step" in r and r["world"] == world]
            return at_world[0] if len(at_world) >= count else None

        try:
            found: dict[str, Any] = wait_for(seen, timeout=timeout, message=f"{count} steps at world {world}")
        except AssertionError:
            raise AssertionError(self.diagnose(job)) from None
        return found

    def wait_state(self, job: Job, *states: JobState, timeout: float = 120) -> Job:
        def reached() -> Job | None:
            job.refresh_from_db()
            return job if job.state in states else None

        try:
            found: Job = wait_for(reached, timeout=timeout, message=f"job state in {states}")
        except AssertionError:
            raise AssertionError(self.diagnose(job)) from None
        return found

    def rank_pids(self, name: str) -> list[int]:
        agent = self.agent(name)
        return [
            p.pid for p in agent.descendants() if any(str(DDP_SCRIPT.name) in part for part in _cmdline(p))
        ]

    def diagnose(self, job: Job) -> str:
        from console.telemetry.models import Event

        job.refresh_from_db()
        events = [f"  {e.kind}: {e.message}" for e in Event.objects.filter(job=job).order_by("id")]
        steps = [r for r in self.progress(job)][-8:]
        agents = "\n".join(f"--- agent {a.name}\n{_tail(a.log(), 25)}" for a in self.agents.agents)
        return (
            f"job {job.pk} state={job.state} round={job.round_number} restarts={job.restarts}\n"
            f"events:\n" + "\n".join(events) + f"\nprogress tail: {steps}\n"
            f"--- controller\n{self.controller.tail(40)}\n{agents}"
        )


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def assert_resumes_from_checkpoints(records: list[dict[str, Any]], *, every: int, total: int) -> None:
    """The step counter always resumes from the latest checkpoint: never 0, never ahead.

    A graceful stop checkpoints the exact step; a crash loses at most one interval: exactly one
    when it comes after a checkpoint step was logged and before that checkpoint's file was
    renamed into place (bench/chaos saw it: a kill during the write of step 260's snapshot
    resumed at 250, as it should).
    """
    highest = 0
    segments = 0
    expect_next: int | None = None
    for record in records:
        if record.get("event") == "start":
            segments += 1
            resume = int(record["resume_step"])
            if segments > 1 and highest >= every:
                assert resume > 0, f"segment {segments} restarted from 0 after reaching step {highest}"
            assert resume <= highest, f"segment {segments} resumed at {resume}, ahead of step {highest}"
            assert resume >= highest - every, (
                f"segment {segments} resumed at {resume}, lost too much of {highest}"
            )
            expect_next = resume + 1
            continue
        step = int(record["step"])
        if expect_next is not None:
            assert step == expect_next, f"expected step {expect_next} after resume, got {step}"
            expect_next = None
        highest = max(highest, step)
    assert highest == total, f"training ended at step {highest}, wanted {total}"
    assert segments >= 1


@pytest.fixture
def cluster(transactional_db: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A controller and agents; a test module's CONTROLLER_ENV adds to the controller's settings."""
    url = settings.REDIS_URL
    redis.Redis.from_url(url).flushdb()
    operator = User.objects.create_user("e2e-operator", password="pw-e2e-1")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(operator)
    controller = Controller(
        url,
        tmp_path / "controller",
        **{
            "TRAINYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT),
            # Generous on a loaded 2-core machine: a busy agent must not look lost.
            "TRAINYARD_HEARTBEAT_MISSES": "5",
            "TRAINYARD_PING_DEADLINE": "3",
            "TRAINYARD_CONTROLLER_TICK": "0.5",
            **getattr(request.module, "CONTROLLER_ENV", {}),
        },
    )
    agents = AgentProcs(tmp_path, url, token=settings.NODE_TOKEN)
    controller.start()
    try:
        yield Cluster(controller, agents, api, tmp_path)
    finally:
        agents.cleanup()
        controller.kill()  # its state is in PostgreSQL: nothing to wind down at the end of a test
        redis.Redis.from_url(url).flushdb()
