"""Hung jobs: agents' hang reports and the controller's drift check, gathered into one ``Hang`` per
stall, concluded with the ``job.hang`` event and the job's policy.

A host whose ranks stopped making progress for longer than the job's threshold reports with every
local rank's stacks (workers/agent/hangwatch.py, CONTROL_HANG_REPORTED). The first report of a
round opens a Hang and asks the round's other hosts for their stacks (AGENT_COLLECT_STACKS); a
heartbeat whose ranks have drifted more than ``max_drift_steps`` apart opens one too. Once every
host of the round has reported, or HANG_GATHER_SECONDS passed (the tick: ``conclude_gathered``),
the Hang is concluded: stackgroups.py names the ranks at fault from all the stacks, ``job.hang``
is emitted (warning) naming them with the stacks grouped, and the policy acts: ``notify`` (the
event only), ``restart`` (a new round, charged like a failure: past max_restarts the job fails),
``fail``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from console.cluster.models import Node
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import JobState, RoundReason
from console.core.transport import send_on_commit
from console.jobs import stackgroups
from console.jobs.hang_models import Hang, RankStack
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job
from console.jobs.rounds import finish_job
from workers import protocol
from workers.agent.hang import ACTIONS, drifted

log = logging.getLogger(__name__)

# How long a hang waits for the other hosts' stacks before it is concluded without them. Hosts
# stall together (a collective blocks every rank), so their reports come within a second or two.
HANG_GATHER_SECONDS = 3.0
# A report for a round whose hang was concluded this long ago or more opens a new hang.
HANG_REOPEN_SECONDS = 10.0
POLICY_FIELDS = {
    "timeout_s": float,
    "multiple": float,
    "floor_s": float,
    "first_step_s": float,
    "action": str,
    "max_drift_steps": int,
}


class PolicyError(ValueError):
    """A hang policy the job spec cannot have; ``errors`` by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def check_policy(data: Any) -> protocol.HangPolicy:
    """The job spec's ``hang``, checked: known fields, positive numbers, a known action."""
    if data in (None, ""):
        return {}
    if not isinstance(data, dict):
        raise PolicyError({"hang": "must be an object"})
    errors: dict[str, str] = {}
    policy: dict[str, Any] = {}
    for name, value in data.items():
        kind = POLICY_FIELDS.get(name)
        if kind is None:
            errors[name] = f"unknown field (known: {', '.join(POLICY_FIELDS)})"
        elif kind is str:
            if value not in ACTIONS:
                errors[name] = f"must be one of {', '.join(ACTIONS)}"
            else:
                policy[name] = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            errors[name] = "must be a number"
        elif value < 0 or (name != "max_drift_steps" and value == 0):
            errors[name] = "must be positive" if name != "max_drift_steps" else "must be 0 or more"
        elif name == "max_drift_steps" and value != int(value):
            errors[name] = "must be a whole number"
        else:
            policy[name] = kind(value)
    if errors:
        raise PolicyError(errors)
    return policy  # type: ignore[return-value]


def _open_hang(job: Job, number: int, reason: str, now: datetime) -> tuple[Hang, bool]:
    """The round's hang still gathering (or just concluded), else a new one; (hang, created)."""
    latest = Hang.objects.filter(job=job, round_number=number).order_by("-detected_at").first()
    if latest is not None and (
        latest.concluded_at is None or now - latest.concluded_at < timedelta(seconds=HANG_REOPEN_SECONDS)
    ):
        return latest, False
    return Hang.objects.create(job=job, round_number=number, reason=reason, detected_at=now), True


def _ask_others(job: Job, number: int, but: str, reason: str) -> None:
    """Asks the round's hosts other than ``but`` for their stacks (those that already sent them
    for this hang are not asked)."""
    reported = RankStack.objects.filter(
        hang__job=job, hang__round_number=number, hang__concluded_at__isnull=True
    ).values_list("node_name", flat=True)
    nodes = Node.objects.filter(allocations__round__job=job, allocations__round__number=number)
    for node in nodes.exclude(name=but).exclude(name__in=list(reported)):
        send_on_commit(protocol.AGENT_COLLECT_STACKS, node.queue, job_id=job.pk, round=number, reason=reason)


def record_report(node_name: str, job_id: int, number: int, report: protocol.HangReport) -> None:
    with decision():
        now = timezone.now()
        job = Job.objects.select_for_update(of=("self",)).filter(pk=job_id).first()
        if job is None or job.round_number != number or not job.job_state.is_active:
            return  # an old round, or a job that is over
        if not Allocation.objects.filter(round__job=job, round__number=number, node__name=node_name).exists():
            return
        if (
            report["reason"] == "asked"
            and not Hang.objects.filter(job=job, round_number=number, concluded_at__isnull=True).exists()
        ):
            return  # the hang it answers was concluded without it
        hang, created = _open_hang(job, number, report["reason"], now)
        if report["stalled"]:
            hang.stalled = sorted(set(hang.stalled) | set(report["stalled"]))
            hang.threshold_s = max(hang.threshold_s, float(report["threshold_s"]))
            hang.save(update_fields=["stalled", "threshold_s"])
        for stack in report["ranks"]:
            if hang.stacks.filter(rank=int(stack["rank"]), native=True).exists():
                continue  # its native frames came already: keep them
            RankStack.objects.update_or_create(
                hang=hang,
                rank=int(stack["rank"]),
                defaults={
                    "node_name": node_name,
                    "local_rank": int(stack["local_rank"]),
                    "pid": int(stack["pid"]),
                    "process_state": str(stack["process_state"])[:32],
                    "step": stack["step"],
                    "stalled_s": float(stack["stalled_s"]),
                    "cpu_percent": float(stack["cpu_percent"]),
                    "threads": stack["threads"],
                    "native": bool(stack["native"]),
                    "error": str(stack["error"]),
                    "flight_recorder": str(stack.get("flight_recorder", ""))[:1024],
                    "collected_at": now,
                },
            )
        if created:
            _ask_others(job, number, node_name, f"rank(s) {report['stalled']} on {node_name} stalled")
        if hang.concluded_at is None and _every_host_reported(hang):
            conclude(job, hang)


def _add_native_frames(job: Job, number: int, node_name: str, report: protocol.HangReport) -> None:
    """The second report of a host: the same ranks' stacks with native frames (slower to read)."""
    hang = Hang.objects.filter(job=job, round_number=number).order_by("-detected_at").first()
    if hang is None:
        return
    for stack in report["ranks"]:
        hang.stacks.filter(rank=int(stack["rank"]), node_name=node_name).update(
            threads=stack["threads"], native=True
        )


def _every_host_reported(hang: Hang) -> bool:
    hosts = set(
        Allocation.objects.filter(round__job=hang.job_id, round__number=hang.round_number).values_list(
            "node__name", flat=True
        )
    )
    return hosts <= set(hang.stacks.values_list("node_name", flat=True))


def check_drift(job: Job, number: int) -> None:
    """Called with the job locked, after a heartbeat stored its host's ranks' steps: ranks more
    than the policy's ``max_drift_steps`` apart open a hang (once per stall)."""
    limit = int(job.hang_policy.get("max_drift_steps") or 0)
    if limit <= 0:
        return
    steps: dict[int, int] = {}
    for rank_steps in Allocation.objects.filter(round__job=job, round__number=number).values_list(
        "rank_steps", flat=True
    ):
        steps.update({int(rank): int(step) for rank, step in (rank_steps or {}).items()})
    behind = drifted(steps, limit)
    if not behind:
        return
    now = timezone.now()
    hang, created = _open_hang(job, number, "drift", now)
    if created:
        hang.stalled = behind
        hang.save(update_fields=["stalled"])
        _ask_others(job, number, "", f"rank(s) {behind} drifted over {limit} steps behind")


def conclude_gathered() -> None:
    """The tick: hangs whose hosts did not all report within HANG_GATHER_SECONDS."""
    cutoff = timezone.now() - timedelta(seconds=HANG_GATHER_SECONDS)
    for hang_id, job_id in Hang.objects.filter(concluded_at__isnull=True, detected_at__lt=cutoff).values_list(
        "pk", "job_id"
    ):
        with decision():
            job = Job.lock(job_id)
            hang = Hang.objects.select_for_update().get(pk=hang_id)
            if hang.concluded_at is None:
                conclude(job, hang)


def conclude(job: Job, hang: Hang) -> None:
    """Name the ranks at fault, emit ``job.hang`` and apply the job's policy."""
    stacks = [stack_dict(s) for s in hang.stacks.all()]
    ranks, why = stackgroups.culprits(stacks, hang.stalled)
    groups = stackgroups.group(stacks)
    hang.ranks = ranks
    hang.summary = stackgroups.summary(stacks, hang.stalled)
    hang.concluded_at = timezone.now()
    current = job.round_number == hang.round_number and job.job_state.is_active
    action = str(job.hang_policy.get("action") or "notify") if current else "none"
    hang.action = action
    hang.save(update_fields=["ranks", "summary", "concluded_at", "action"])
    what = "drifted apart" if hang.reason == "drift" else "stopped making progress"
    events.emit(
        "job.hang",
        f"Round {hang.round_number} {what}: {hang.summary}",
        job=job,
        round_number=hang.round_number,
        severity=Severity.WARNING,
        hang=hang.pk,
        ranks=ranks,
        why=why,
        reason=hang.reason,
        threshold_s=hang.threshold_s,
        action=action,
        groups=[{"ranks": list(g.ranks), "label": g.label} for g in groups],
    )
    if action == "restart":
        if job.restarts >= job.max_restarts:
            job.failure = {"hang": hang.pk, "ranks": ranks, "why": why}
            finish_job(
                job,
                JobState.FAILED,
                f"Failed: hung ({hang.summary}) after {job.restarts} restart(s)",
                Severity.ERROR,
            )
        else:
            change_membership(job, RoundReason.FAILURE)
    elif action == "fail":
        job.failure = {"hang": hang.pk, "ranks": ranks, "why": why}
        finish_job(job, JobState.FAILED, f"Failed: hung ({hang.summary})", Severity.ERROR)


def stack_dict(stack: RankStack) -> dict[str, Any]:
    return {
        "rank": stack.rank,
        "local_rank": stack.local_rank,
        "node": stack.node_name,
        "pid": stack.pid,
        "process_state": stack.process_state,
        "step": stack.step,
        "stalled_s": stack.stalled_s,
        "cpu_percent": stack.cpu_percent,
        "threads": stack.threads,
        "native": stack.native,
        "error": stack.error,
        "flight_recorder": stack.flight_recorder,
        "collected_at": stack.collected_at.isoformat(),
    }


def hang_dict(hang: Hang) -> dict[str, Any]:
    """A hang as the API and the job page show it: its stacks and their groups."""
    stacks = [stack_dict(s) for s in hang.stacks.all()]
    return {
        "id": hang.pk,
        "round": hang.round_number,
        "reason": hang.reason,
        "threshold_s": hang.threshold_s,
        "stalled": hang.stalled,
        "ranks": hang.ranks,
        "summary": hang.summary,
        "action": hang.action,
        "detected_at": hang.detected_at.isoformat(),
        "concluded_at": hang.concluded_at.isoformat() if hang.concluded_at else None,
        "groups": [
            {"ranks": list(g.ranks), "label": g.label, "text": g.text, "frames": list(g.frames)}
            for g in stackgroups.group(stacks)
        ],
        "stacks": stacks,
    }
