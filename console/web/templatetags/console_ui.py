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
def progress_label(progress: Any) -> str:
    """``1,200/4,000 steps``, ``3,072,000/4,608,000 examples``, ``step 1,200`` (no total)."""
    return job_progress.label(progress)


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
