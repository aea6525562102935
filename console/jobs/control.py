"""The controller: every decision about where jobs run and which round they are in.

Operators' actions (submit, resize, restart, stop) and agents' reports (register, heartbeat,
rank exits, round ends) land here, as do the periodic tick's checks (lost nodes, pending jobs,
auto-scaling, draining). All state lives in the database; every decision runs under one
controller lock (a PostgreSQL advisory lock held for the transaction), so any number of
controller threads or processes can run, die and restart without two of them placing the
same capacity or starting the same round twice.

Rounds: a round is a fixed membership. Starting, resizing, restarting and losing a node each
create a new round; agents stop the old round's ranks and start the new round's, which resume
from the latest checkpoint. Agents fence by round number, so a late command or report for an
old round does nothing.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from console.cluster.models import Gpu, Node
from console.core.models import AuditEntry
from console.core.states import JobState, NodeState
from console.jobs.models import Allocation, AllocationState, Job, Round, RoundReason
from console.telemetry import events
from console.telemetry.models import Severity
from workers import protocol

log = logging.getLogger(__name__)

# Advisory lock key for "the controller is deciding" (any 64-bit number unique to us).
CONTROLLER_LOCK_KEY = 0x7472_6169_6E79
# MASTER_PORT range: below Linux's ephemeral range (32768+) so outgoing connections never
# hold the port we hand to rank 0's store.
MASTER_PORT_RANGE = (20000, 32000)
# A start command the agent has not acknowledged (no heartbeat lists the round) after this many
# seconds is sent again: covers a controller killed between commit and send.
START_RESEND_AFTER = 8.0
# Commands expire so an agent that was down does not act on an old decision.
COMMAND_EXPIRES = 120


class ControlError(Exception):
    """An operator request that cannot be carried out now; the message says why."""


class InvalidRequest(ControlError):
    """An operator request that can never be carried out as given (e.g. out of range)."""


# --- locking and messaging ------------------------------------------------------------------


@contextlib.contextmanager
def decision() -> Iterator[None]:
    """A transaction holding the controller lock (serialises all placement decisions)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CONTROLLER_LOCK_KEY])
        yield


def _send(name: str, queue: str, **kwargs: Any) -> None:
    """Send a Celery task after the current transaction commits."""

    def send() -> None:
        try:
            current_app.send_task(name, kwargs=kwargs, queue=queue, expires=COMMAND_EXPIRES)
        except Exception:  # the heartbeat repair loop re-sends what is missing
            log.warning("sending %s to %s failed", name, queue, exc_info=True)

    transaction.on_commit(send)


def token_ok(token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(str(token), settings.NODE_TOKEN)


# --- capacity -------------------------------------------------------------------------------


@dataclass
class Capacity:
    """Free capacity of one node: CPU rank slots and GPU indices."""

    node: Node
    free_slots: int
    free_gpus: list[int]

    def fits(self, job: Job) -> bool:
        if job.gpus_per_proc:
            return len(self.free_gpus) >= job.nproc_per_node * job.gpus_per_proc
        return self.free_slots >= job.nproc_per_node


def live_allocations() -> Any:
    """Allocations whose ranks may be running: the current round of every active job."""
    return Allocation.objects.filter(
        round__job__state__in=[s.value for s in JobState if s.is_active],
        round__number=F("round__job__round_number"),
    ).filter(state__in=[AllocationState.ASSIGNED, AllocationState.RUNNING])


def capacities(exclude_job: Job | None = None) -> dict[int, Capacity]:
    """Free capacity of every schedulable node, leaving out ``exclude_job``'s own allocations."""
    nodes = {n.pk: n for n in Node.objects.filter(state=NodeState.ONLINE)}
    gpus: dict[int, list[int]] = {pk: [] for pk in nodes}
    for gpu in Gpu.objects.filter(node_id__in=list(nodes)).order_by("index"):
        gpus[gpu.node_id].append(gpu.index)
    caps = {pk: Capacity(n, n.slots, list(gpus[pk])) for pk, n in nodes.items()}
    allocations = live_allocations().select_related("round__job")
    if exclude_job is not None:
        allocations = allocations.exclude(round__job=exclude_job)
    for alloc in allocations:
        cap = caps.get(alloc.node_id)
        if cap is None:
            continue
        job = alloc.round.job
        if job.gpus_per_proc:
            cap.free_gpus = [g for g in cap.free_gpus if g not in alloc.gpu_indices]
        else:
            cap.free_slots -= alloc.nproc
    return caps


# --- rounds ---------------------------------------------------------------------------------


def _pick_port(node: Node) -> int:
    recent = set(
        Round.objects.filter(
            allocations__node=node,
            allocations__node_rank=0,
            created_at__gte=timezone.now() - timedelta(hours=1),
        ).values_list("master_port", flat=True)
    )
    for _ in range(64):
        port = random.randrange(*MASTER_PORT_RANGE)
        if port not in recent:
            return port
    return random.randrange(*MASTER_PORT_RANGE)


def _ordered_members(job: Job, nodes: Sequence[Node]) -> list[Node]:
    """Nodes that stay keep their relative order (so node rank 0 stays put); new ones follow."""
    previous = job.current_round()
    order: dict[int, int] = {}
    if previous is not None:
        order = {a.node_id: a.node_rank for a in previous.allocations.all()}
    staying = sorted((n for n in nodes if n.pk in order), key=lambda n: order[n.pk])
    joining = sorted((n for n in nodes if n.pk not in order), key=lambda n: n.name)
    return staying + joining


def run_id(job: Job) -> str:
    """torchrun's run id for the job: the same for all its rounds, unique across consoles and
    database resets (agents key checkpoint directories on it)."""
    return f"trainyard-job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}"


def round_spec(job: Job, rnd: Round, alloc: Allocation) -> protocol.RoundSpec:
    bundle: protocol.BundleRef | None = None
    if job.bundle_id and job.bundle:
        base = settings.TRAINYARD_PUBLIC_URL.rstrip("/")
        bundle = {"sha256": job.bundle.sha256, "url": f"{base}/api/v1/bundles/{job.bundle.sha256}/archive/"}
    return {
        "job_id": job.pk,
        "round": rnd.number,
        "run_id": run_id(job),
        "node_rank": alloc.node_rank,
        "nnodes": rnd.allocations.count(),
        "nproc_per_node": job.nproc_per_node,
        "world_size": rnd.world_size,
        "master_addr": rnd.master_addr,
        "master_port": rnd.master_port,
        "workload": job.workload,
        "entrypoint": job.entrypoint,
        "args": [str(a) for a in job.args],
        "bundle": bundle,
        "workdir": job.workdir,
        "env": {str(k): str(v) for k, v in job.env.items()},
        "hyperparameters": job.hyperparameters,
        "strategy": job.strategy,
        "precision": job.precision,
        "grad_accum_steps": job.grad_accum_steps,
        "gpu_indices": list(alloc.gpu_indices),
        "restart_count": job.rounds.filter(number__lt=rnd.number).count(),
        "max_restarts": job.max_restarts,
        "grace_period": job.grace_period,
    }


def _state_for(reason: RoundReason) -> JobState:
    if reason in (RoundReason.START, RoundReason.RESUME):
        return JobState.STARTING
    if reason in (RoundReason.FAILURE, RoundReason.RESTART):
        return JobState.RESTARTING
    return JobState.RESIZING


def new_round(
    job: Job,
    nodes: Sequence[Node],
    reason: RoundReason,
    *,
    charged: bool = False,
    caps: dict[int, Capacity] | None = None,
) -> Round:
    """Give ``job`` a new round on ``nodes`` and tell every agent concerned. Caller holds decision()."""
    if not nodes:
        raise ControlError("a round needs at least one node")
    caps = caps if caps is not None else capacities(exclude_job=job)
    members = _ordered_members(job, nodes)
    previous = job.current_round()
    number = job.round_number + 1
    rnd = Round.objects.create(
        job=job,
        number=number,
        reason=reason,
        world_size=len(members) * job.nproc_per_node,
        master_addr=members[0].address or members[0].hostname or "127.0.0.1",
        master_port=_pick_port(members[0]),
        charged=charged,
    )
    for rank, node in enumerate(members):
        gpu_indices: list[int] = []
        if job.gpus_per_proc:
            need = job.nproc_per_node * job.gpus_per_proc
            gpu_indices = caps[node.pk].free_gpus[:need] if node.pk in caps else []
            if node.pk in caps:
                caps[node.pk].free_gpus = caps[node.pk].free_gpus[need:]
        elif node.pk in caps:
            caps[node.pk].free_slots -= job.nproc_per_node
        Allocation.objects.create(
            round=rnd, node=node, node_rank=rank, nproc=job.nproc_per_node, gpu_indices=gpu_indices
        )
    if previous is not None:
        _end_round(previous, outcome=reason.value)
    job.set_state(_state_for(reason))
    job.round_number = number
    if job.started_at is None:
        job.started_at = timezone.now()
    job.save(update_fields=["state", "round_number", "started_at", "restarts"])

    kept = {n.pk for n in members}
    if previous is not None:
        # A round broken by a failure or a lost host cannot checkpoint together (its collectives
        # are gone, and ranks blocked in C++ ignore SIGTERM): kill it at once everywhere.
        broken = previous.outcome == "failed" or reason in (RoundReason.FAILURE, RoundReason.NODE_LOSS)
        for alloc in previous.allocations.select_related("node"):
            if broken or alloc.node_id not in kept:
                _send(
                    protocol.AGENT_STOP_JOB,
                    alloc.node.queue,
                    job_id=job.pk,
                    round=previous.number,
                    grace_period=0.0 if broken else job.grace_period,
                )
    for alloc in rnd.allocations.select_related("node"):
        _send(protocol.AGENT_START_ROUND, alloc.node.queue, spec=round_spec(job, rnd, alloc))
    events.emit(
        f"round.{reason.value}",
        f"Round {number}: {len(members)} node(s), world size {rnd.world_size} ({reason.label.lower()})",
        job=job,
        round_number=number,
        nodes=[n.name for n in members],
        world_size=rnd.world_size,
        charged=charged,
    )
    events.job_changed(job)
    return rnd


def _end_round(rnd: Round, outcome: str) -> None:
    if rnd.ended_at is None:
        rnd.ended_at = timezone.now()
        rnd.outcome = rnd.outcome or outcome
        rnd.save(update_fields=["ended_at", "outcome"])
    rnd.allocations.filter(state__in=[AllocationState.ASSIGNED, AllocationState.RUNNING]).update(
        state=AllocationState.STOPPED
    )


def _stop_everywhere(job: Job, rnd: Round | None) -> None:
    if rnd is None:
        return
    for alloc in rnd.allocations.select_related("node"):
        _send(
            protocol.AGENT_STOP_JOB,
            alloc.node.queue,
            job_id=job.pk,
            round=rnd.number,
            grace_period=job.grace_period,
        )


def _finish(job: Job, state: JobState, message: str, severity: str = Severity.INFO, **data: Any) -> None:
    rnd = job.current_round()
    job.set_state(state)
    job.finished_at = timezone.now()
    job.save(update_fields=["state", "finished_at", "failure", "restarts"])
    if rnd is not None:
        _end_round(rnd, outcome=state.value.lower())
        if state is not JobState.SUCCEEDED:
            _stop_everywhere(job, rnd)
    events.emit(f"job.{state.value.lower()}", message, job=job, severity=severity, **data)
    events.job_changed(job)
    transaction.on_commit(request_reconcile)


def _to_pending(job: Job, why: str) -> None:
    """Too few nodes remain: stop the ranks, keep the progress, wait for capacity."""
    rnd = job.current_round()
    if rnd is not None:
        _end_round(rnd, outcome="pending")
        _stop_everywhere(job, rnd)
    job.set_state(JobState.PENDING)
    job.save(update_fields=["state", "restarts"])
    events.emit("job.pending", why, job=job, severity=Severity.WARNING)
    events.job_changed(job)


def request_reconcile() -> None:
    try:
        current_app.send_task("trainyard.control.reconcile", queue=protocol.CONTROL_QUEUE, expires=30)
    except Exception:
        log.warning("could not enqueue reconcile", exc_info=True)


# --- operator actions -----------------------------------------------------------------------


def _locked_job(job_id: int) -> Job:
    return Job.objects.select_for_update(of=("self",)).select_related("bundle").get(pk=job_id)


def _round_nodes(rnd: Round | None) -> list[Node]:
    if rnd is None:
        return []
    return [a.node for a in rnd.allocations.select_related("node").order_by("node_rank")]


def submit_job(job: Job, actor: Any) -> Job:
    """Store a validated job as PENDING and ask the scheduler to place it."""
    with transaction.atomic():
        job.state = JobState.PENDING
        job.save()
        AuditEntry.record(actor, "job.submit", job, spec_name=job.name)
        events.emit(
            "job.submitted", f"Job {job.name} submitted ({job.nnodes} x {job.nproc_per_node})", job=job
        )
        events.job_changed(job)
        transaction.on_commit(request_reconcile)
    return job


def resize_job(job_id: int, nodes: int, actor: Any) -> Job:
    """Set the node count of a job to ``nodes`` (MIN <= nodes <= MAX) and start the new round."""
    with decision():
        job = _locked_job(job_id)
        if not job.min_nodes <= nodes <= job.max_nodes:
            raise InvalidRequest(
                f"Job {job.name} runs on {job.nnodes} nodes; {nodes} is outside {job.min_nodes}..{job.max_nodes}."
            )
        if job.job_state.is_terminal:
            raise ControlError(f"Job {job.name} is {job.state}; only live jobs can be resized.")
        previous_desired = job.desired_nodes
        job.desired_nodes = nodes
        job.save(update_fields=["desired_nodes"])
        AuditEntry.record(actor, "job.resize", job, nodes=nodes, previous=previous_desired)
        events.emit("job.resize_requested", f"Resize to {nodes} node(s) requested", job=job, nodes=nodes)
        if job.job_state.is_active:
            _converge(job, reason=RoundReason.RESIZE)
        else:
            transaction.on_commit(request_reconcile)
    job.refresh_from_db()
    return job


def restart_job(job_id: int, actor: Any) -> Job:
    """Restart a live job's ranks on the same nodes from the latest checkpoint (not charged)."""
    with decision():
        job = _locked_job(job_id)
        if not job.job_state.is_active:
            raise ControlError(f"Job {job.name} is {job.state}; only a running job can be restarted.")
        nodes = _round_nodes(job.current_round())
        AuditEntry.record(actor, "job.restart", job)
        new_round(job, nodes, RoundReason.RESTART)
    job.refresh_from_db()
    return job


def stop_job(job_id: int, actor: Any) -> Job:
    with decision():
        job = _locked_job(job_id)
        if job.job_state.is_terminal:
            raise ControlError(f"Job {job.name} is already {job.state}.")
        AuditEntry.record(actor, "job.stop", job)
        who = getattr(actor, "username", "") or "system"
        _finish(job, JobState.STOPPED, f"Stopped by {who}")
    job.refresh_from_db()
    return job


# --- converging a job to its target ------------------------------------------------------


def _fill(job: Job, members: list[Node], caps: dict[int, Capacity], target: int) -> list[Node]:
    """``members`` plus free nodes that fit ``job`` (by name) until there are ``target``."""
    members = list(members)
    for cap in sorted(caps.values(), key=lambda c: c.node.name):
        if len(members) >= target:
            break
        if cap.node.pk not in {n.pk for n in members} and cap.fits(job):
            members.append(cap.node)
    return members


def _converge(job: Job, reason: RoundReason, caps: dict[int, Capacity] | None = None) -> bool:
    """Start a new round if the job's live node set should change. Returns True if it did."""
    caps = caps if caps is not None else capacities(exclude_job=job)
    current = _round_nodes(job.current_round())
    keep = [n for n in current if n.state == NodeState.ONLINE]
    target = job.desired_nodes
    # Shrinking drops the highest node ranks, so rank 0 stays where it is.
    keep = keep[:target] if len(keep) > target else _fill(job, keep, caps, target)
    if [n.pk for n in keep] == [n.pk for n in current]:
        return False
    if len(keep) < job.min_nodes:
        return False
    new_round(job, keep, reason, caps=caps)
    return True


# --- agent reports --------------------------------------------------------------------------


def register_node(node_name: str, session: str, info: protocol.NodeInfo) -> Node:
    with decision():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        created = node is None
        if node is None:
            node = Node(name=node_name, state=NodeState.ONLINE)
        restarted = not created and node.agent_session != session
        node.hostname = info.get("hostname", "")[:255]
        node.address = info.get("address", "")[:255]
        node.cpus = int(info.get("cpus", 0))
        node.memory_bytes = int(info.get("memory_bytes", 0))
        node.slots = int(info.get("slots", node.cpus))
        node.torch_version = str(info.get("torch_version", ""))[:32]
        node.agent_version = str(info.get("agent_version", ""))[:32]
        node.agent_session = session
        node.last_heartbeat = timezone.now()
        was = node.state
        if node.state in (NodeState.LOST, NodeState.OFFLINE):
            node.set_state(NodeState.ONLINE)
        if created:
            node.registered_at = timezone.now()
        node.save()
        seen = set()
        for gpu in info.get("gpus", []):
            seen.add(int(gpu["index"]))
            Gpu.objects.update_or_create(
                node=node,
                index=int(gpu["index"]),
                defaults={
                    "name": gpu.get("name", "")[:128],
                    "uuid": gpu.get("uuid", "")[:64],
                    "memory_bytes": int(gpu.get("memory_bytes", 0)),
                },
            )
        node.gpus.exclude(index__in=seen).delete()
        if created:
            events.emit(
                "node.registered",
                f"Node {node.name} registered ({node.cpus} CPUs, {len(seen)} GPUs)",
                node=node,
            )
        elif was != node.state:
            events.emit("node.online", f"Node {node.name} is back ({was} → ONLINE)", node=node)
        elif restarted:
            events.emit("node.restarted", f"Agent on {node.name} restarted", node=node)
        if restarted:
            # A restarted agent lost its ranks: their rounds cannot go on with this node as it was.
            _node_gone(node, "restarted")
        events.node_changed(node)
        _sync(node)
        transaction.on_commit(request_reconcile)
    return node


def _sync(node: Node) -> None:
    specs = [
        round_spec(a.round.job, a.round, a)
        for a in live_allocations().filter(node=node).select_related("round__job__bundle")
    ]
    _send(protocol.AGENT_SYNC, node.queue, rounds=specs)


def heartbeat(
    node_name: str, session: str, load: protocol.NodeLoad, rounds: list[protocol.RoundStatus]
) -> None:
    now = timezone.now()
    node = Node.objects.filter(name=node_name).first()
    if node is None or node.agent_session != session:
        # An agent we don't know (or an old session of it): ask nothing, it will register.
        return
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=now,
        cpu_percent=float(load.get("cpu_percent", 0.0)),
        memory_percent=float(load.get("memory_percent", 0.0)),
    )
    for gpu in load.get("gpus", []):
        Gpu.objects.filter(node=node, index=int(gpu["index"])).update(
            utilization=float(gpu.get("utilization", 0.0)),
            memory_used_bytes=int(gpu.get("memory_used_bytes", 0)),
        )
    if node.state == NodeState.LOST:
        with decision():
            node = Node.objects.select_for_update().get(pk=node.pk)
            if node.state == NodeState.LOST:
                node.set_state(NodeState.ONLINE)
                node.save(update_fields=["state"])
                events.emit("node.online", f"Node {node.name} is back", node=node)
                _sync(node)
                transaction.on_commit(request_reconcile)
    node.last_heartbeat = now
    node.cpu_percent = float(load.get("cpu_percent", 0.0))
    node.memory_percent = float(load.get("memory_percent", 0.0))
    events.node_changed(node)
    _apply_round_statuses(node, rounds)


def _apply_round_statuses(node: Node, rounds: list[protocol.RoundStatus]) -> None:
    reported = {(int(r["job_id"]), int(r["round"])): r for r in rounds}
    # Rounds the agent runs that it should not: stop them (a lost stop command, or fencing).
    for (job_id, number), reported_status in reported.items():
        if protocol.RoundState(reported_status["state"]).is_final:
            continue
        job = Job.objects.filter(pk=job_id).only("id", "state", "round_number", "grace_period").first()
        live = (
            job is not None
            and job.job_state.is_active
            and job.round_number == number
            and Allocation.objects.filter(round__job=job, round__number=number, node=node).exists()
        )
        if not live:
            current_app.send_task(
                protocol.AGENT_STOP_JOB,
                kwargs={"job_id": job_id, "round": number, "grace_period": job.grace_period if job else 5.0},
                queue=node.queue,
                expires=COMMAND_EXPIRES,
            )
    # Our live allocations on this node: promote, record progress, re-send lost starts.
    for alloc in live_allocations().filter(node=node).select_related("round__job"):
        rnd, job = alloc.round, alloc.round.job
        status = reported.get((job.pk, rnd.number))
        if status is None:
            age = (timezone.now() - rnd.created_at).total_seconds()
            if age > START_RESEND_AFTER and alloc.state == AllocationState.ASSIGNED:
                log.info("re-sending start of job %s round %s to %s", job.pk, rnd.number, node.name)
                with transaction.atomic():
                    _send(protocol.AGENT_START_ROUND, node.queue, spec=round_spec(job, rnd, alloc))
            continue
        _apply_status(job.pk, rnd.number, alloc.pk, status)


def _apply_status(job_id: int, number: int, alloc_id: int, status: protocol.RoundStatus) -> None:
    with decision():
        job = _locked_job(job_id)
        if job.round_number != number or not job.job_state.is_active:
            return
        alloc = Allocation.objects.select_for_update().get(pk=alloc_id)
        if (
            status["state"] in (protocol.RoundState.RUNNING, protocol.RoundState.STARTING)
            and alloc.state == AllocationState.ASSIGNED
        ):
            alloc.state = AllocationState.RUNNING
            alloc.save(update_fields=["state"])
        changed = False
        if status["state"] == protocol.RoundState.RUNNING and job.state != JobState.RUNNING:
            job.set_state(JobState.RUNNING)
            changed = True
            events.emit("job.running", f"Running round {number}", job=job)
        step = status.get("last_step")
        if step is not None and int(step) != job.progress.get("step"):
            job.progress = {**job.progress, "step": int(step)}
            total = job.hyperparameters.get("steps")
            if isinstance(total, int):
                job.progress["total"] = total
            changed = True
        first = status.get("first_step_at")
        if first:
            first_at = datetime.fromtimestamp(float(first), tz=timezone.get_current_timezone())
            Round.objects.filter(job=job, number=number, first_step_at__isnull=True).update(
                first_step_at=first_at
            )
        if changed:
            job.save(update_fields=["state", "progress"])
            events.job_changed(job)


def _reported(node_name: str, now: datetime) -> None:
    """Any report from an agent proves its host is alive, like a heartbeat."""
    Node.objects.filter(name=node_name).update(last_heartbeat=now)


def rank_exited(node_name: str, job_id: int, number: int, exit: protocol.RankExit) -> None:
    with decision():
        now = timezone.now()
        _reported(node_name, now)
        job = Job.objects.select_for_update(of=("self",)).filter(pk=job_id).first()
        if job is None or job.round_number != number or not job.job_state.is_active:
            return  # fenced: an old round, or a job that is already over
        alloc = Allocation.objects.filter(round__job=job, round__number=number, node__name=node_name).first()
        if alloc is None:
            return
        exits = alloc.exit_info.get("exits", [])
        exits.append(dict(exit))
        alloc.exit_info = {**alloc.exit_info, "exits": exits}
        alloc.save(update_fields=["exit_info"])
        if exit.get("teardown"):
            _teardown_event(job, alloc, exit)
        if _failed(exit):
            _handle_failure(job, alloc, exit, now)


def _teardown_event(job: Job, alloc: Allocation, exit: protocol.RankExit) -> None:
    """The rank's code had ended when its interpreter's teardown crashed or hung (a torch gloo
    bug, workers/agent/runner.py): the code's exit code stands, and operators are told."""
    what = "hung and was killed" if exit["teardown"] == "hung" else f"died by {exit['teardown']}"
    events.emit(
        "rank.teardown",
        f"Rank {exit['rank']} on {alloc.node.name} ended with exit code {exit['exit_code']}, "
        f"then its interpreter {what} while tearing down; the exit code stands",
        job=job,
        node=alloc.node,
        severity=Severity.WARNING,
        rank=exit["rank"],
        exit_code=exit["exit_code"],
        teardown=exit["teardown"],
    )


def _failed(exit: protocol.RankExit) -> bool:
    return exit.get("exit_code") != 0 or bool(exit.get("signal"))


def _handle_failure(job: Job, alloc: Allocation, exit: protocol.RankExit, now: datetime) -> None:
    """Record the round's first failure, then decide once every host has shown it is alive."""
    rnd = alloc.round
    if alloc.is_live:
        alloc.state = AllocationState.FAILED
        alloc.save(update_fields=["state"])
    if rnd.outcome:
        _settle_failure(job, rnd)  # this report may be the proof of life that was missing
        return
    cause = {
        "round": rnd.number,
        "node": alloc.node.name,
        "rank": exit.get("rank"),
        "local_rank": exit.get("local_rank"),
        "exit_code": exit.get("exit_code"),
        "signal": exit.get("signal"),
        "error": (exit.get("error") or "")[-4000:],
    }
    rnd.outcome = "failed"
    rnd.failed_at = now
    rnd.failure = cause
    rnd.save(update_fields=["outcome", "failed_at", "failure"])
    events.emit(
        "rank.failed",
        f"Rank {cause['rank']} on {cause['node']} failed with {_what(cause)}",
        job=job,
        node=alloc.node,
        severity=Severity.ERROR,
        cause=cause,
    )
    _settle_failure(job, rnd)


def _what(cause: dict[str, Any]) -> str:
    return f"signal {cause['signal']}" if cause["signal"] else f"exit code {cause['exit_code']}"


def _settle_failure(job: Job, rnd: Round) -> None:
    """Restart (charged) or fail a job whose current round had a rank failure.

    Peers of a dead host fail in their collectives long before its heartbeats are missed, so a
    failure is only charged once every host of the round has reported or heartbeated since the
    failure. A host that never does is declared LOST, and the node-loss round (a membership
    change, not charged) replaces this one instead.
    """
    if job.round_number != rnd.number or rnd.outcome != "failed" or not job.job_state.is_active:
        return
    assert rnd.failed_at is not None
    nodes = _round_nodes(rnd)
    waiting = [
        n.name
        for n in nodes
        if n.state in (NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED)
        and (n.last_heartbeat is None or n.last_heartbeat < rnd.failed_at)
    ]
    if waiting:
        return
    cause = rnd.failure
    if job.restarts >= job.max_restarts:
        job.failure = cause
        _finish(
            job,
            JobState.FAILED,
            f"Failed: rank {cause['rank']} on {cause['node']} ({_what(cause)}) after {job.restarts} restart(s)",
            severity=Severity.ERROR,
            cause=cause,
        )
        return
    job.restarts += 1
    online = [n for n in nodes if n.state == NodeState.ONLINE]
    if len(online) < job.min_nodes:
        _to_pending(job, f"Rank failure and only {len(online)} node(s) available; waiting for capacity")
        return
    new_round(job, online, RoundReason.FAILURE, charged=True)


def _settle_failed_rounds() -> None:
    failed = Round.objects.filter(
        outcome="failed",
        number=F("job__round_number"),
        job__state__in=[s.value for s in JobState if s.is_active],
    ).values_list("job_id", flat=True)
    for job_id in list(failed):
        with decision():
            job = _locked_job(job_id)
            rnd = job.current_round()
            if rnd is not None:
                _settle_failure(job, rnd)


def round_ended(
    node_name: str, job_id: int, number: int, outcome: str, failures: list[protocol.RankExit]
) -> None:
    with decision():
        now = timezone.now()
        _reported(node_name, now)
        job = Job.objects.select_for_update(of=("self",)).filter(pk=job_id).first()
        if job is None or job.round_number != number or not job.job_state.is_active:
            return
        alloc = (
            Allocation.objects.filter(round__job=job, round__number=number, node__name=node_name)
            .select_related("round", "node")
            .first()
        )
        if alloc is None:
            return
        if outcome == "succeeded":
            alloc.state = AllocationState.SUCCEEDED
            alloc.save(update_fields=["state"])
            rnd = alloc.round
            if not rnd.allocations.exclude(state=AllocationState.SUCCEEDED).exists():
                _finish(job, JobState.SUCCEEDED, f"Succeeded in round {number}")
        elif outcome == "failed" and failures:
            _handle_failure(job, alloc, failures[0], now)
        elif outcome == "failed":
            _handle_failure(
                job,
                alloc,
                {
                    "local_rank": -1,
                    "rank": -1,
                    "pid": 0,
                    "exit_code": 1,
                    "signal": None,
                    "error": "round failed",
                    "at": 0.0,
                },
                now,
            )


def node_offline(node_name: str, session: str) -> None:
    with decision():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None or node.agent_session != session or node.state == NodeState.OFFLINE:
            return
        node.set_state(NodeState.OFFLINE)
        node.save(update_fields=["state"])
        events.emit("node.offline", f"Agent on {node.name} stopped", node=node)
        events.node_changed(node)
        _node_gone(node, "went offline")


# --- node loss and the periodic tick ----------------------------------------------------


def _node_gone(node: Node, how: str) -> None:
    """Every active job with a live allocation on ``node`` gets a round without it (or waits)."""
    for alloc in live_allocations().filter(node=node).select_related("round__job"):
        job = _locked_job(alloc.round.job_id)
        if job.round_number != alloc.round.number or not job.job_state.is_active:
            continue
        _refund_failures_caused_by(job, node)
        survivors = [n for n in _round_nodes(alloc.round) if n.pk != node.pk and n.state == NodeState.ONLINE]
        # Fill back toward the target from free nodes, if any.
        caps = capacities(exclude_job=job)
        caps.pop(node.pk, None)
        survivors = _fill(job, survivors, caps, job.desired_nodes)
        if len(survivors) >= job.min_nodes:
            events.emit(
                "job.node_lost",
                f"Node {node.name} {how}; continuing on {len(survivors)} node(s)",
                job=job,
                node=node,
                severity=Severity.WARNING,
            )
            new_round(job, survivors, RoundReason.NODE_LOSS, caps=caps)
        else:
            _to_pending(job, f"Node {node.name} {how}; {len(survivors)} node(s) left, {job.min_nodes} needed")


def _refund_failures_caused_by(job: Job, node: Node) -> None:
    """Rank failures right after a node died were the node's loss, not the job's fault.

    _settle_failure already waits for every host to show it is alive before charging, but a
    heartbeat the dead host sent just before dying can be processed after the failure and
    look like that proof; this undoes such a charge when the host is then declared lost.
    """
    since = (node.last_heartbeat or timezone.now()) - timedelta(seconds=settings.HEARTBEAT_INTERVAL)
    charged = job.rounds.filter(charged=True, reason=RoundReason.FAILURE, created_at__gte=since)
    refunded = charged.update(charged=False)
    if refunded:
        job.restarts = max(0, job.restarts - refunded)
        job.save(update_fields=["restarts"])


def tick() -> None:
    """Periodic checks: lost nodes, finished drains, pending jobs, auto-scaling."""
    _detect_lost_nodes()
    _settle_failed_rounds()
    _progress_drains()
    schedule()


def _detect_lost_nodes() -> None:
    limit = timezone.now() - timedelta(seconds=settings.HEARTBEAT_INTERVAL * settings.HEARTBEAT_MISSES)
    overdue = Node.objects.filter(
        Q(last_heartbeat__lt=limit) | Q(last_heartbeat__isnull=True),
        state__in=[NodeState.ONLINE, NodeState.DRAINING, NodeState.DRAINED],
    ).values_list("pk", flat=True)
    for pk in list(overdue):
        with decision():
            node = Node.objects.select_for_update().get(pk=pk)
            if node.node_state is NodeState.LOST or not node.heartbeat_overdue():
                continue
            node.set_state(NodeState.LOST)
            node.save(update_fields=["state"])
            events.emit(
                "node.lost",
                f"Node {node.name} missed {settings.HEARTBEAT_MISSES} heartbeats",
                node=node,
                severity=Severity.WARNING,
            )
            events.node_changed(node)
            _node_gone(node, "was lost")


def _progress_drains() -> None:
    for node in Node.objects.filter(state=NodeState.DRAINING):
        with decision():
            node = Node.objects.select_for_update().get(pk=node.pk)
            if node.state != NodeState.DRAINING:
                continue
            allocations = list(live_allocations().filter(node=node).select_related("round__job"))
            for alloc in allocations:
                job = _locked_job(alloc.round.job_id)
                survivors = [
                    n for n in _round_nodes(alloc.round) if n.pk != node.pk and n.state == NodeState.ONLINE
                ]
                if job.elastic and len(survivors) >= job.min_nodes:
                    events.emit(
                        "job.drained_off", f"Moving off draining node {node.name}", job=job, node=node
                    )
                    new_round(job, survivors, RoundReason.SCALE)
            if not live_allocations().filter(node=node).exists():
                node.set_state(NodeState.DRAINED)
                node.save(update_fields=["state"])
                events.emit("node.drained", f"Node {node.name} is drained", node=node)
                events.node_changed(node)


def _queue_order() -> list[Job]:
    return list(Job.objects.filter(state=JobState.PENDING).order_by("-priority", "created_at", "id"))


def schedule() -> None:
    """Place pending jobs (gang: at least MIN nodes or nothing), then grow elastic jobs."""
    with decision():
        for pending in _queue_order():
            job = _locked_job(pending.pk)
            if job.state != JobState.PENDING:
                continue
            caps = capacities(exclude_job=job)
            fitting = sorted((c for c in caps.values() if c.fits(job)), key=lambda c: c.node.name)
            if len(fitting) < job.min_nodes:
                freed = _make_room_for(job, needed=job.min_nodes - len(fitting))
                if not freed:
                    # FIFO within a priority: later jobs wait behind this one.
                    break
                caps = capacities(exclude_job=job)
                fitting = sorted((c for c in caps.values() if c.fits(job)), key=lambda c: c.node.name)
                if len(fitting) < job.min_nodes:
                    break
            chosen = [c.node for c in fitting[: job.desired_nodes]]
            reason = RoundReason.RESUME if job.round_number else RoundReason.START
            new_round(job, chosen, reason, caps=caps)
        _grow_elastic_jobs()


def _grow_elastic_jobs() -> None:
    if Job.objects.filter(state=JobState.PENDING).exists():
        return  # free capacity belongs to the queue first
    running = Job.objects.filter(state=JobState.RUNNING).order_by("-priority", "created_at")
    for candidate in running:
        job = _locked_job(candidate.pk)
        rnd = job.current_round()
        if rnd is None or rnd.allocations.count() >= job.desired_nodes:
            continue
        _converge(job, RoundReason.SCALE)


def _make_room_for(job: Job, needed: int) -> bool:
    """Shrink lower-priority elastic jobs toward MIN so ``job`` fits. Returns True if any shrank."""
    shrunk = False
    victims = Job.objects.filter(
        state__in=[JobState.RUNNING, JobState.STARTING, JobState.RESIZING], priority__lt=job.priority
    ).order_by("priority", "-created_at")
    for victim in victims:
        if needed <= 0:
            break
        victim = _locked_job(victim.pk)
        nodes = _round_nodes(victim.current_round())
        spare = len(nodes) - victim.min_nodes
        if spare <= 0:
            continue
        drop = min(spare, needed)
        keep = nodes[: len(nodes) - drop]
        events.emit(
            "job.shrunk",
            f"Shrinking to {len(keep)} node(s) to make room for higher-priority job {job.name}",
            job=victim,
            severity=Severity.WARNING,
        )
        new_round(victim, keep, RoundReason.SCALE)
        needed -= drop
        shrunk = True
    return shrunk


def reconcile() -> None:
    tick()
