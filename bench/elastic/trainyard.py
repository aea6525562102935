"""Trainyard's side of the elastic bench: a controller and three agents, the plain script on the
restart path and the SDK script in place, each case timed from its own logs (bench/elastic/run.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.elastic.common import (
    DDP_SCRIPT,
    HEARTBEAT,
    REPO,
    SDK_SCRIPT,
    STEP_SLEEP,
    TRAINED_STEPS,
    ddp_args,
    first_record_after,
    first_step_after,
    script_pids,
    wait_records,
    wait_steps,
)
from bench.harness import Bench


class Trainyard:
    """A controller and three agents (the bench harness's console) against the bench's database;
    jobs go through the REST API, called in-process."""

    def __init__(self, bench: Bench) -> None:
        from django.contrib.auth.models import User
        from rest_framework.test import APIClient

        self.root = bench.root
        self.console = bench.console
        self.agents = bench.console.agents
        self.kill_settled: float | None = None  # the last in-place rank kill: kill → round made
        self.api = APIClient()
        self.api.force_authenticate(User.objects.get_or_create(username="bench", is_superuser=True)[0])
        self.console.start_controller(TRAINYARD_CONTROLLER_TICK="0.5")
        for name in ("bench-a", "bench-b", "bench-c"):
            self.agents.start(name, heartbeat=HEARTBEAT)
        self.wait_online(3)
        self.wait_pools()

    def wait_pools(self) -> None:
        """Agents that just booted are still filling their warm pools (imports on every core):
        the cases measure hosts in their steady state."""
        from tests.support.agents import wait_pool_settled

        for agent in self.agents.agents:
            if agent.popen.poll() is None:
                wait_pool_settled(agent, timeout=180)

    def wait_online(self, count: int) -> None:
        from console.cluster.models import Node

        deadline = time.monotonic() + 90
        while Node.objects.filter(state="ONLINE").count() < count:
            if time.monotonic() > deadline:
                raise RuntimeError("agents did not register")
            time.sleep(0.2)

    def submit(self, progress: Path, nnodes: str, nproc: int, desired: int | None = None) -> int:
        body = {
            "name": "bench",
            "entrypoint": str(DDP_SCRIPT),
            "workdir": str(REPO),
            "args": ddp_args(progress),
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "max_restarts": 100,
            "grace_period": 10,
        }
        job_id: int = self.api.post("/api/v1/jobs/", body, format="json").json()["id"]
        if desired is not None:
            self.api.post(f"/api/v1/jobs/{job_id}/resize/", {"nodes": desired}, format="json")
        return job_id

    def stop(self, job_id: int, script: Path = DDP_SCRIPT) -> None:
        self.api.post(f"/api/v1/jobs/{job_id}/stop/")
        # Wait until no rank of the job is left, so cases don't overlap.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            script_pids(a.pid, script) for a in self.agents.agents if a.popen.poll() is None
        ):
            time.sleep(0.2)

    def missed(self, job_id: int, why: str) -> None:
        """Says why a rep has no figure, with what the console knew of the job then."""
        from console.jobs.models import Job

        job = Job.objects.get(pk=job_id)
        rnd = job.current_round()
        where = (
            f"round {rnd.number} ({rnd.reason}, world {rnd.world_size}, first step {rnd.first_step_at})"
            if rnd
            else "no round"
        )
        events = [f"{e.kind}: {e.message}"[:160] for e in job.events.order_by("-id")[:4]]
        print(f"  no figure: {why}; job {job.state}, {where}; last events: {events}", flush=True)

    def rank_kill(self, work: Path) -> float | None:
        self.wait_pools()
        progress = work / "progress.jsonl"
        job = self.submit(progress, "1", 2)
        try:
            if not wait_steps(progress, 2, TRAINED_STEPS):
                self.missed(job, f"fewer than {TRAINED_STEPS} steps at world 2 before the kill")
                return None
            node = self.node_of(job, rank=0)
            victim = script_pids(node.pid)[-1]
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            took = first_step_after(progress, t0, timeout=30)
            if took is None:
                self.missed(job, "no step within 30 s of the kill")
            return took
        finally:
            self.stop(job)

    def scale_up(self, work: Path) -> float | None:
        self.wait_pools()
        progress = work / "progress.jsonl"
        job = self.submit(progress, "1:3", 1, desired=2)
        try:
            if not wait_steps(progress, 2, TRAINED_STEPS):
                self.missed(job, f"fewer than {TRAINED_STEPS} steps at world 2 before the resize")
                return None
            t0 = time.time()
            response = self.api.post(f"/api/v1/jobs/{job}/resize/", {"nodes": 3}, format="json")
            assert response.status_code == 200, response.content
            took = first_step_after(progress, t0, world=3, timeout=30)
            if took is None:
                self.missed(job, "no step at world 3 within 30 s of the resize")
            return took
        finally:
            self.stop(job)

    def node_kill(self, work: Path) -> float | None:
        self.wait_pools()
        progress = work / "progress.jsonl"
        job = self.submit(progress, "2:3", 1)
        try:
            if not wait_steps(progress, 3, TRAINED_STEPS):
                self.missed(job, f"fewer than {TRAINED_STEPS} steps at world 3 before the kill")
                return None
            agent = self.node_of(job, rank=2)
            ranks = script_pids(agent.pid)
            t0 = time.time()
            agent.kill()
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            took = first_step_after(progress, t0, world=2, timeout=30)
            if took is None:
                self.missed(job, "no step at world 2 within 30 s of the node kill")
            return took
        finally:
            self.stop(job)
            self.revive()

    def inplace_resizes(self, work: Path) -> tuple[float | None, float | None]:
        """An SDK job (in place) resized 2 → 3, then 3 → 2: seconds from each API call to the
        first step at the new world in the new round. Each resize is made once the round before
        has formed (a change while one is still forming restarts); a change that did not happen
        in place counts as none."""
        self.wait_pools()  # the joiner comes from a settled warm pool, as on an idle host
        record = work / "record.jsonl"
        body = {
            "name": "bench-inplace",
            "entrypoint": str(SDK_SCRIPT),
            "workdir": str(REPO),
            "args": ["--record", str(record), "--examples", "200000", "--step-sleep", str(STEP_SLEEP)],
            "nnodes": "1:3",
            "nproc_per_node": 1,
            "max_restarts": 100,
            "grace_period": 10,
            "elastic": "inplace",
        }
        job: int = self.api.post("/api/v1/jobs/", body, format="json").json()["id"]
        self.api.post(f"/api/v1/jobs/{job}/resize/", {"nodes": 2}, format="json")
        try:
            if not self.settled(job, world=2) or not wait_records(record, world=2, count=TRAINED_STEPS):
                return None, None
            up = self.timed_resize(job, record, 3)
            if up is None or not self.settled(job, world=3):
                return up, None
            return up, self.timed_resize(job, record, 2)
        finally:
            self.stop(job, script=SDK_SCRIPT)

    def inplace_failures(self, work: Path) -> tuple[float | None, float | None]:
        """An SDK job (in place) on three nodes: a rank SIGKILL → the next step in the next round
        (from the kill), then a node loss → the first step at world 2 (from the round the loss
        made, i.e. once it was declared). A round not in place counts as none."""
        from console.jobs.models import Round

        self.wait_pools()
        record = work / "record.jsonl"
        body = {
            "name": "bench-inplace-failures",
            "entrypoint": str(SDK_SCRIPT),
            "workdir": str(REPO),
            "args": ["--record", str(record), "--examples", "200000", "--step-sleep", str(STEP_SLEEP)],
            "nnodes": "2:3",
            "nproc_per_node": 1,
            "max_restarts": 100,
            "grace_period": 10,
            "elastic": "inplace",
        }
        job: int = self.api.post("/api/v1/jobs/", body, format="json").json()["id"]
        kill = loss = None
        try:
            if not self.settled(job, world=3) or not wait_records(record, world=3, count=TRAINED_STEPS):
                return None, None
            before = self.round_of(job)
            victim = script_pids(self.node_of(job, rank=2).pid, SDK_SCRIPT)[-1]
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            kill = first_record_after(record, t0, world=3, round_above=before)
            recovered = Round.objects.filter(job_id=job, number=before + 1).first()
            if recovered is None or not recovered.inplace:
                print(f"  round {before + 1} was not in place", flush=True)
                kill = None
            else:  # where the time went: settling the failure, then forming the round
                self.kill_settled = recovered.created_at.timestamp() - t0
            if not self.settled(job, world=3) or not wait_records(record, world=3, count=TRAINED_STEPS):
                return kill, None
            before = self.round_of(job)
            agent = self.node_of(job, rank=2)
            ranks = script_pids(agent.pid, SDK_SCRIPT)
            agent.kill()
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while self.round_of(job) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            declared = Round.objects.filter(job_id=job, number=before + 1).first()
            if declared is None or not declared.inplace:
                print(f"  round {before + 1} was not in place", flush=True)
                return kill, None
            t1 = declared.created_at.timestamp()
            loss = first_record_after(record, t1, world=2, round_above=before)
            return kill, loss
        finally:
            self.stop(job, script=SDK_SCRIPT)
            self.revive()

    def round_of(self, job: int) -> int:
        from console.jobs.models import Round

        return int(Round.objects.filter(job_id=job).order_by("-number").values_list("number", flat=True)[0])

    def timed_resize(self, job: int, record: Path, nodes: int) -> float | None:
        from console.jobs.models import Round

        before = Round.objects.filter(job_id=job).order_by("-number").values_list("number", flat=True)[0]
        t0 = time.time()
        response = self.api.post(f"/api/v1/jobs/{job}/resize/", {"nodes": nodes}, format="json")
        assert response.status_code == 200, response.content
        took = first_record_after(record, t0, world=nodes, round_above=before)
        with (record.parent / "resizes.jsonl").open("a") as log:  # for reading the records after
            log.write(json.dumps({"t0": t0, "nodes": nodes, "round_above": before, "took": took}) + "\n")
        if not Round.objects.filter(job_id=job, number=before + 1, inplace=True).exists():
            print(f"  round {before + 1} was not in place", flush=True)
            return None
        return took

    def settled(self, job_id: int, world: int, timeout: float = 60.0) -> bool:
        """The job's current round has ``world`` ranks and, if in place, has formed."""
        from console.jobs.models import Job, RoundPhase

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rnd = Job.objects.get(pk=job_id).current_round()
            if rnd is not None and rnd.world_size == world and rnd.state != RoundPhase.FORMING:
                return True
            time.sleep(0.05)
        return False

    def node_of(self, job_id: int, rank: int) -> Any:
        from console.jobs.models import Job

        job = Job.objects.get(pk=job_id)
        rnd = job.current_round()
        assert rnd is not None
        name = rnd.allocations.get(node_rank=rank).node.name
        return next(a for a in self.agents.agents if a.name == name and a.popen.poll() is None)

    def revive(self) -> None:
        live = {a.name for a in self.agents.agents if a.popen.poll() is None}
        for name in ("bench-a", "bench-b", "bench-c"):
            if name not in live:
                # A host that runs one rank per round keeps twice that warm; a freshly started
                # agent first fills its pool to the cap (4). Capped at 2, a revived host is in
                # the others' steady state after half the imports (one rank per host in every
                # case after the rank kills, which run first).
                self.agents.start(name, heartbeat=HEARTBEAT, extra_args=["--warm-pool", "2"])
        self.wait_online(3)
        self.wait_pools()

    def close(self) -> None:
        self.console.stop()
