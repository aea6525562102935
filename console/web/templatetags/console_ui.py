"""Small display helpers shared by the console's templates."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from console.jobs import progress as job_progress

register = template.Library()


def progress_fraction(progress: Any) -> float | None:
    """0..1 when the job's progress has a total, else None (console/jobs/progress.py)."""
    return job_progress.fraction(progress)


@register.filter
def percent(progress: Any) -> int | None:
    fraction = progress_fraction(progress)
    return None if fraction is None else round(fraction * 100)


@register.filter
def progress_parts(progress: Any) -> tuple[str, str]:
    """The label's number part and its unit, for a big number with a small unit."""
    return job_progress.parts(progress)


@register.filter
def progress_label(progress: Any) -> str:
    """``1,200/4,000 steps``, ``3,072,000/4,608,000 examples``, ``step 1,200`` (no total)."""
    return job_progress.label(progress)


_ROLE_NAMES = {"coordinator": "coordinator", "ps": "PS", "worker": "worker"}


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5" (with an en dash)."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}\u2013{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


@register.filter
def allocation_lines(rnd: Any) -> list[dict[str, Any]]:
    """A round's allocations as the Rounds table shows them, one line each: node, node rank,
    global ranks, GPUs (or CPU), a parameter-server job's processes by role, state. Mirrors
    frontend/src/job/rounds.js (allocationLines)."""
    lines = []
    base = 0
    for alloc in sorted(rnd.allocations.all(), key=lambda a: a.node_rank):
        processes = alloc.processes or []
        if processes:
            ranks = [int(p["rank"]) for p in processes if not p.get("removed")]
        else:
            ranks = list(range(base, base + alloc.nproc))
        base += alloc.nproc
        roles = [
            _ROLE_NAMES.get(p["role"], p["role"])
            + ("" if p["role"] == "coordinator" else f" {p['index']}")
            + (" (removed)" if p.get("removed") else "")
            for p in processes
        ]
        gpus = alloc.gpu_indices or []
        lines.append(
            {
                "node": alloc.node.name,
                "node_rank": alloc.node_rank,
                "ranks": rank_ranges(ranks) if ranks else "—",
                "count": len(ranks),
                "gpus": f"GPU {', '.join(map(str, gpus))}" if gpus else "CPU",
                "roles": roles,
                "state": alloc.state,
            }
        )
    return lines


@register.filter
def age(moment: datetime | None) -> str:
    """Compact age for tables: 42s, 5m, 3h, 2d."""
    if moment is None:
        return "never"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@register.filter
def state_class(state: str) -> str:
    return f"badge badge-{str(state).lower()}"


@register.filter
def gib(num_bytes: int | None) -> str:
    if not num_bytes:
        return "—"
    return f"{num_bytes / 2**30:.1f} GiB"


@register.filter
def lookup(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.simple_tag
def operator_role(user: Any) -> bool:
    from console.core.roles import is_operator

    return is_operator(user)


@register.filter
def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)
