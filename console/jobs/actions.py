"""Operator actions on jobs: submit, resize, restart, stop.

The API views (console/jobs/api.py) call these; the pages call the API, and so does the CLI.
Each checks the request (ControlError / InvalidRequest carry the message the operator sees),
records it in the audit log and carries it out in one decision.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from console.core import events
from console.core.decision import decision
from console.core.models import AuditEntry
from console.core.states import JobState, RoundReason
from console.core.transport import request_tick
from console.jobs import parameter_server
from console.jobs import roles as job_roles
from console.jobs.membership import change_membership
from console.jobs.models import Job
from console.jobs.rounds import finish_job


class ControlError(Exception):
    """An operator request that cannot be carried out now; the message says why."""


class InvalidRequest(ControlError):
    """An operator request that can never be carried out as given (e.g. out of range)."""


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
        request_tick()
    return job


def resize_role(job_id: int, role: str, count: int, actor: Any) -> Job:
    """Set a parameter-server job's ``role`` ("worker" or "ps") to ``count`` processes. Workers
    change in place (the PS and the other workers run on); a PS count change is a new round whose
    PS re-shard from the checkpoint."""
    with decision():
        job = Job.lock(job_id)
        if not job.is_parameter_server:
            raise InvalidRequest(f"Job {job.name} has no roles ({job.strategy}); resize it by nodes.")
        if job.job_state.is_terminal:
            raise ControlError(f"Job {job.name} is {job.state}; only live jobs can be resized.")
        try:
            roles = job_roles.resized(job.roles, role, count)
        except job_roles.RolesError as exc:
            raise InvalidRequest(str(exc)) from None
        previous = job.role_count(role)
        rnd = job.current_round()
        change = None
        if role == job_roles.WORKER and job.job_state.is_active and rnd is not None and not rnd.ended:
            # In place, in the current round (planning.plan_workers); None: no room on its nodes.
            change = change_membership(job, RoundReason.RESIZE, workers=count)
            if change is None:
                raise ControlError(f"The round's nodes have no room for {count} live worker(s).")
        job.roles = roles
        job.save(update_fields=["roles"])
        AuditEntry.record(actor, "job.resize", job, role=role, count=count, previous=previous)
        events.emit(
            "job.resize_requested",
            f"Resize of the {role} role to {count} requested",
            job=job,
            role=role,
            count=count,
        )
        if change is not None and change.removed and not change.hybrid and rnd is not None:
            parameter_server.end_if_done(job, rnd)  # the workers left may all have ended
        if role == job_roles.PS and job.job_state.is_active:
            change_membership(job, RoundReason.RESIZE)
        elif not job.job_state.is_active:
            request_tick()
        events.job_changed(job)
    job.refresh_from_db()
    return job


def resize_job(job_id: int, nodes: int, actor: Any) -> Job:
    """Set the node count of a job to ``nodes`` (MIN <= nodes <= MAX) and start the new round."""
    with decision():
        job = Job.lock(job_id)
        if job.is_parameter_server:
            raise InvalidRequest(
                f"Job {job.name} is a parameter_server job: resize its worker or ps role, not its nodes."
            )
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
            change_membership(job, RoundReason.RESIZE)
        else:
            request_tick()  # a pending job is placed at its new size by the scheduler
    job.refresh_from_db()
    return job


def restart_job(job_id: int, actor: Any) -> Job:
    """Restart a live job's ranks on the same nodes from the latest checkpoint (not charged)."""
    with decision():
        job = Job.lock(job_id)
        if not job.job_state.is_active:
            raise ControlError(f"Job {job.name} is {job.state}; only a running job can be restarted.")
        AuditEntry.record(actor, "job.restart", job)
        if change_membership(job, RoundReason.RESTART) is None:
            raise ControlError(f"Job {job.name} has no nodes to restart on.")
    job.refresh_from_db()
    return job


def stop_job(job_id: int, actor: Any) -> Job:
    """Stop a job for good: its ranks get SIGTERM and the grace period; it ends STOPPED."""
    with decision():
        job = Job.lock(job_id)
        if job.job_state.is_terminal:
            raise ControlError(f"Job {job.name} is already {job.state}.")
        AuditEntry.record(actor, "job.stop", job)
        who = getattr(actor, "username", "") or "system"
        finish_job(job, JobState.STOPPED, f"Stopped by {who}")
    job.refresh_from_db()
    return job
