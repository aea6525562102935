"""In-place rounds (jobs whose script uses workers/sdk/elastic.py): formed, or fallen back.

An in-place round keeps the previous round's ranks running; each host reports in its heartbeats
whether its ranks have re-formed at the new round (protocol.RoundStatus.inplace). Once every host
says "formed" the round is formed (Round.formed_at; the membership change took formed_at -
created_at). When a host says "failed", a rank of the round fails before it formed, or it has not
formed within INPLACE_FORM_TIMEOUT seconds, the controller falls back to today's restart path:
a FALLBACK round on the same nodes, every rank started afresh, with an event that says why.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from console.core.decision import decision
from console.core.states import JobState, RoundOutcome, RoundReason
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job, Round
from console.telemetry import events
from console.telemetry.models import Severity
from workers import protocol


def form_timeout() -> float:
    return float(settings.INPLACE_FORM_TIMEOUT)


def forming(rnd: Round) -> bool:
    """An in-place round that is the job's open round and has not formed yet."""
    return rnd.inplace and rnd.formed_at is None and rnd.round_outcome is RoundOutcome.OPEN


def record_status(job: Job, alloc: Allocation, status: protocol.RoundStatus) -> bool:
    """A heartbeat's word on the host's in-place ranks (job and allocation locked by the caller).
    Returns True when the round was replaced by a fallback."""
    rnd = alloc.round
    reported = status.get("inplace")
    if reported == protocol.INPLACE_WAITING and alloc.inplace != reported:
        # A rank here saw a peer fail and waits for the next round: the host is alive since the
        # failure (failures.settle_failure takes this as its proof of life).
        alloc.inplace = reported
        alloc.save(update_fields=["inplace"])
        return False
    if not forming(rnd) or reported is None:
        return False
    if reported == protocol.INPLACE_FAILED:
        reason = status.get("inplace_reason") or "a rank could not re-form its process group"
        fall_back(job, rnd, f"{alloc.node.name}: {reason}")
        return True
    if alloc.inplace != reported:
        alloc.inplace = reported
        alloc.save(update_fields=["inplace"])
    if (
        reported == protocol.INPLACE_FORMED
        and not rnd.allocations.exclude(inplace=protocol.INPLACE_FORMED).exists()
    ):
        # The hosts' ranks formed the group together (one collective): the time the last host
        # reports is the round's, to the millisecond, not the heartbeat's.
        reported_at = status.get("inplace_formed_at")
        rnd.formed_at = timezone.now()
        if reported_at:
            rnd.formed_at = min(rnd.formed_at, datetime.fromtimestamp(float(reported_at), tz=UTC))
            rnd.formed_at = max(rnd.formed_at, rnd.created_at)
        rnd.save(update_fields=["formed_at"])
        took = (rnd.formed_at - rnd.created_at).total_seconds()
        events.emit(
            "round.formed",
            f"Round {rnd.number} formed in place in {took:.1f} s (world size {rnd.world_size})",
            job=job,
            round_number=rnd.number,
            seconds=round(took, 3),
        )
    return False


def fall_back(job: Job, rnd: Round, why: str) -> None:
    """Give up on ``rnd`` forming in place: restart its nodes' ranks afresh (not charged)."""
    events.emit(
        "round.inplace_failed",
        f"In-place round {rnd.number} did not form ({why}); restarting its ranks",
        job=job,
        severity=Severity.WARNING,
        round_number=rnd.number,
        reason=why,
    )
    change_membership(job, RoundReason.FALLBACK)


def check_forming_rounds() -> None:
    """The tick's pass: an in-place round not formed within the bound falls back."""
    cutoff = timezone.now() - timedelta(seconds=form_timeout())
    late = Round.objects.filter(
        formed_at__isnull=True,
        ended_at__isnull=True,
        created_at__lt=cutoff,
        number=F("job__round_number"),
        job__state__in=[s.value for s in JobState if s.is_active],
    ).exclude(carry_over={})
    for job_id in list(late.values_list("job_id", flat=True)):
        with decision():
            job = Job.lock(job_id)
            rnd = job.current_round()
            if rnd is not None and forming(rnd) and rnd.created_at < cutoff:
                fall_back(job, rnd, f"not formed within {form_timeout():.0f} s")
