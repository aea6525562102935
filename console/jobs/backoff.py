"""Launch failures and crash-loop back-off: pure decisions, no database.

A **launch failure** is a round whose ranks never started, or never reached their peers: the
agent could not fetch the bundle, the entrypoint or interpreter is missing (the agent marks
those exits ``launch``), or a rank failed in setting up its process group (store unreachable,
gloo's full mesh) before the round took a step. It is the host's configuration, not the job's
code: it is shown with the host and the cause at once, and it is not charged against
``max_restarts``; ``LAUNCH_FAILURE_LIMIT`` of them in a row fail the job.

**Back-off** (Kubernetes' CrashLoopBackOff): a failure restarts at once, so a rank killed in a
running job costs no more than before; a round that fails again without having got going (no
step, and younger than BACKOFF_RESET_SECONDS) waits BACKOFF_BASE_SECONDS, then twice that for
each further one, up to BACKOFF_MAX_SECONDS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# A rank's error that says it could not reach its peers or its round's store: torch's
# DistNetworkError / DistStoreError, gloo's full mesh, a refused or unroutable connection.
NETWORK_ERRORS = re.compile(
    r"DistNetworkError|DistStoreError|connectFullMesh|Connection refused|No route to host|"
    r"Network is unreachable|Connection timed out|client socket has timed out|"
    r"failed to connect to|Socket Timeout|Name or service not known|Temporary failure in name resolution",
    re.IGNORECASE,
)
LAUNCH = "launch"  # the agent could not start the ranks
NETWORK = "network"  # a rank could not reach its peers before the round took a step


def launch_kind(exit: Mapping[str, Any], round_stepped: bool) -> str:
    """Why ``exit`` (a protocol.RankExit) is a launch failure ("launch" or "network"), or "" when
    it is a failure of the job's code."""
    if exit.get("launch"):
        return LAUNCH
    if not round_stepped and NETWORK_ERRORS.search(str(exit.get("error") or "")):
        return NETWORK
    return ""


@dataclass(frozen=True)
class PastRound:
    """What back-off needs of a round: why it was made, when, whether it took a step, and when
    (if ever) it failed, and whether that failure was a launch failure."""

    reason: str  # RoundReason value
    created_at: datetime
    stepped: bool
    failed_at: datetime | None
    launch: bool = False


def false_starts(rounds: Sequence[PastRound], reset_seconds: float, failure_reason: str) -> int:
    """How many rounds in a row, newest first (``rounds[0]`` the one failing now), failed without
    having got going (no step, and failed within ``reset_seconds`` of starting). A round made
    for another reason than a failure (``failure_reason``) ends the run: a resize or a node loss
    is a fresh start."""
    count = 0
    for rnd in rounds:
        if rnd.failed_at is None or rnd.stepped:
            break
        if (rnd.failed_at - rnd.created_at).total_seconds() > reset_seconds:
            break
        count += 1
        if rnd.reason != failure_reason:
            break
    return count


def launch_failures_in_a_row(rounds: Sequence[PastRound], failure_reason: str) -> int:
    """Launch failures in a row, newest first, each round made by the failure of the one before."""
    count = 0
    for rnd in rounds:
        if not rnd.launch:
            break
        count += 1
        if rnd.reason != failure_reason:
            break
    return count


def restart_delay(false_start_count: int, base: float, cap: float) -> float:
    """Seconds to wait before restarting after the ``false_start_count``-th false start in a row:
    none for the first, then ``base``, doubling up to ``cap``."""
    if false_start_count <= 1 or base <= 0:
        return 0.0
    return float(min(cap, base * 2 ** (false_start_count - 2)))
