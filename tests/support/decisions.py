"""In-process controller decisions against the real PostgreSQL, with what they send recorded.

``decide(fn, ...)`` runs one controller function the way a task or a view does, runs its
on-commit callbacks (Django's on_commit semantics, through pytest-django's
django_capture_on_commit_callbacks) with the controller's transport swapped for a recorder, and
returns the exact commands sent and the events stored meanwhile. Nodes and jobs are made here
as rows; no agent or controller process runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core import transport
from console.core.states import NodeState
from console.core.transport import Command
from console.jobs import actions
from console.jobs.models import Job
from console.telemetry.models import Event
from workers import protocol


class Recorder:
    """A transport that keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, command: Command) -> None:
        self.sent.append(command)


@dataclass
class Decided:
    """What one decision sent (in order) and the events it stored (in order)."""

    commands: list[Command] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def all_sent(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every command, pre-flight network checks (console/cluster/network.py) included."""
        return [(c.name, c.queue, c.kwargs) for c in self.commands]

    def sent(self) -> list[tuple[str, str, dict[str, Any]]]:
        """What was sent but pre-flight network checks (tests of those read ``all_sent()``): a
        decision's exact commands, whether or not its nodes were checked together before."""
        return [s for s in self.all_sent() if s[0] != protocol.AGENT_PREFLIGHT]

    def to_agents(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Commands to node queues only (not the controller's own tick requests), pre-flight
        network checks aside (tests of those read ``all_sent()``)."""
        return [s for s in self.sent() if s[1].startswith("node.")]

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


@dataclass
class Decide:
    recorder: Recorder
    capture: Any

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Decided:
        last = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
        self.recorder.sent.clear()
        with self.capture(execute=True):
            fn(*args, **kwargs)
        return Decided(list(self.recorder.sent), list(Event.objects.filter(id__gt=last).order_by("id")))


@pytest.fixture
def decide(db: None, django_capture_on_commit_callbacks: Any) -> Iterator[Decide]:
    recorder = Recorder()
    with transport.use(recorder):
        yield Decide(recorder, django_capture_on_commit_callbacks)


def make_node(
    name: str,
    slots: int = 2,
    gpus: int = 0,
    state: NodeState = NodeState.ONLINE,
    session: str = "",
    seen_ago: float = 0.0,
) -> Node:
    node = Node.objects.create(
        name=name,
        address=f"10.0.0.{Node.objects.count() + 1}",
        slots=slots,
        cpus=slots,
        state=state,
        agent_session=session or f"session-{name}",
        last_heartbeat=timezone.now() - timedelta(seconds=seen_ago),
    )
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, name="NVIDIA A100", memory_bytes=80 << 30)
    return node


def make_job(
    name: str,
    nnodes: str = "1",
    nproc: int = 1,
    gpus_per_proc: int = 0,
    priority: int = 0,
    max_restarts: int = 3,
) -> Job:
    low, _, high = nnodes.partition(":")
    high = high or low
    job = Job(
        name=name,
        entrypoint="/bin/true",
        min_nodes=int(low),
        max_nodes=int(high),
        desired_nodes=int(high),
        nproc_per_node=nproc,
        gpus_per_proc=gpus_per_proc,
        priority=priority,
        max_restarts=max_restarts,
        grace_period=12.0,
    )
    return actions.submit_job(job, None)


def nodes_of(job: Job) -> list[str]:
    """The node names of the job's current round by node rank ([] when it has none running)."""
    job.refresh_from_db()
    rnd = job.current_round()
    if rnd is None or not job.job_state.is_active:
        return []
    return [a.node.name for a in rnd.allocations.order_by("node_rank")]


def start_spec(job: Job, number: int, node_rank: int, nnodes: int, **overrides: Any) -> dict[str, Any]:
    """The RoundSpec the agent at ``node_rank`` must get, written out field by field. The port is
    random, so it is read from the round (and checked to be in range by the caller if needed)."""
    job.refresh_from_db()
    rnd = job.rounds.get(number=number)
    head = rnd.allocations.get(node_rank=0).node
    spec = {
        "job_id": job.pk,
        "round": number,
        "run_id": f"trainyard-job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}",
        "node_rank": node_rank,
        "nnodes": nnodes,
        "nproc_per_node": job.nproc_per_node,
        "world_size": nnodes * job.nproc_per_node,
        "master_addr": head.address,
        "master_port": rnd.master_port,
        "workload": "",
        "entrypoint": "/bin/true",
        "args": [],
        "bundle": None,
        "workdir": "",
        "env": {},
        "hyperparameters": {},
        "strategy": "allreduce",
        "precision": "fp32",
        "grad_accum_steps": 1,
        "gpu_indices": [],
        "restart_count": number - 1,
        "max_restarts": job.max_restarts,
        "grace_period": 12.0,
    }
    if job.inplace and settings.INPLACE_RECOVERY:
        spec["recover_in_place"] = True  # the agent keeps a failed rank's local peers running
    spec.update(overrides)
    return spec


def start(job: Job, number: int, node: str, node_rank: int, nnodes: int, **overrides: Any) -> tuple[Any, ...]:
    return (
        protocol.AGENT_START_ROUND,
        f"node.{node}",
        {"spec": start_spec(job, number, node_rank, nnodes, **overrides)},
    )


def stop(job: Job, number: int, node: str, grace: float) -> tuple[Any, ...]:
    return (
        protocol.AGENT_STOP_JOB,
        f"node.{node}",
        {"job_id": job.pk, "round": number, "grace_period": grace},
    )


TICK: tuple[str, str, dict[str, Any]] = ("trainyard.control.tick", "control", {})


def failing_exit(rank: int = 0, code: int | None = 3, signal: str | None = None, pid: int = 4242) -> Any:
    exit: protocol.RankExit = {
        "local_rank": 0,
        "rank": rank,
        "pid": pid,
        "exit_code": code,
        "signal": signal,
        "error": "Traceback ... ValueError: bad batch",
        "at": 1_700_000_000.5,
    }
    return exit
