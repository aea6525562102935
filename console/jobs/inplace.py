"""In-place rounds (jobs whose script uses workers/sdk/elastic.py): formed, or fallen back.

An in-place round keeps the previous round's ranks running and starts FORMING; each host reports
in its heartbeats how far its ranks are (protocol.InplaceStatus, in RoundStatus.inplace). Once
every host says FORMED the round is RUNNING (Round.formed_at; the membership change took
formed_at - created_at). When a host says FAILED, a rank of the round fails before it formed, or
it has not formed within INPLACE_FORM_TIMEOUT seconds, the controller falls back to the restart
path: a FALLBACK round on the same nodes, every rank started afresh, with an event that says why.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from console.cluster.models import Node
from console.cluster.watch import ALIVE, suspect
from console.core import events
from console.core.decision import decision
from console.core.events import Severity
from console.core.states import JobState, RoundPhase, RoundReason
from console.jobs.membership import change_membership
from console.jobs.models import Allocation, Job, Round
from workers import protocol
from workers.protocol import InplaceStatus


def form_timeout() -> float:
    return float(settings.INPLACE_FORM_TIMEOUT)


def record_status(job: Job, alloc: Allocation, status: protocol.RoundStatus) -> bool:
    """A heartbeat's word on the host's in-place ranks (job and allocation locked by the caller).
    Returns True when the round was replaced by a fallback."""
    rnd = alloc.round
    reported = inplace_status(status)
    if reported is InplaceStatus.WAITING and alloc.inplace != reported:
        # A rank here saw a peer fail and waits for the next round: the host is alive since the
        # failure (failures.settle_failure takes this as its proof of life).
        alloc.inplace = reported
        alloc.save(update_fields=["inplace"])
        if rnd.state != RoundPhase.SETTLING:  # (settling: failures.record_failure pinged them)
            # Its broken collective is evidence against the round's other hosts that have not
            # said they wait too: each is pinged, and lost if it does not answer (watch.suspect).
            others = rnd.allocations.exclude(pk=alloc.pk).exclude(inplace=InplaceStatus.WAITING)
            suspect(Node.objects.filter(pk__in=others.values("node_id"), state__in=ALIVE))
        return False
    if rnd.state != RoundPhase.FORMING or reported is None:
        return False
    if reported is InplaceStatus.FAILED:
        reason = status.get("inplace_reason") or "a rank could not re-form its process group"
        fall_back(job, rnd, f"{alloc.node.name}: {reason}")
        return True
    if alloc.inplace != reported:
        alloc.inplace = reported
        alloc.save(update_fields=["inplace"])
    if (
        reported is InplaceStatus.FORMED
        and not rnd.allocations.exclude(inplace=InplaceStatus.FORMED).exists()
    ):
        # The hosts' ranks formed the group together (one collective): the time the last host
        # reports is the round's, to the millisecond, not the heartbeat's.
        reported_at = status.get("inplace_formed_at")
        formed_at = timezone.now()
        if reported_at:
            formed_at = min(formed_at, datetime.fromtimestamp(float(reported_at), tz=UTC))
            formed_at = max(formed_at, rnd.created_at)
        rnd.save(update_fields=rnd.set_state(RoundPhase.RUNNING, at=formed_at))
        took = (formed_at - rnd.created_at).total_seconds()
        events.emit(
            "round.formed",
            f"Round {rnd.number} formed in place in {took:.1f} s (world size {rnd.world_size})",
            job=job,
            round_number=rnd.number,
            seconds=round(took, 3),
        )
    return False


def inplace_status(status: protocol.RoundStatus) -> InplaceStatus | None:
    """The host's word on its in-place ranks, if it said one this version understands."""
    try:
        return InplaceStatus(status["inplace"]) if "inplace" in status else None
    except ValueError:
        return None


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
        state=RoundPhase.FORMING,
        created_at__lt=cutoff,
        number=F("job__round_number"),
        job__state__in=[s.value for s in JobState if s.is_active],
    )
    for job_id in list(late.values_list("job_id", flat=True)):
        with decision():
            job = Job.lock(job_id)
            rnd = job.current_round()
            if rnd is not None and rnd.state == RoundPhase.FORMING and rnd.created_at < cutoff:
                fall_back(job, rnd, f"not formed within {form_timeout():.0f} s")
