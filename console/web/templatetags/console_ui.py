"""Small display helpers shared by the console's templates."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

_TOTAL_KEYS = ("total_steps", "max_steps", "steps_total", "total")


def progress_fraction(progress: Any) -> float | None:
    """0..1 when the job reports how far it is, else None.

    Workloads report either ``fraction`` or a ``step`` with a total; both are accepted so the
    page does not depend on one workload's choice.
    """
    if not isinstance(progress, dict):
        return None
    fraction = progress.get("fraction")
    if isinstance(fraction, int | float):
        return max(0.0, min(1.0, float(fraction)))
    step = progress.get("step")
    total = next((progress[k] for k in _TOTAL_KEYS if isinstance(progress.get(k), int | float)), None)
    if isinstance(step, int | float) and total:
        return max(0.0, min(1.0, float(step) / float(total)))
    return None


@register.filter
def percent(progress: Any) -> int | None:
    fraction = progress_fraction(progress)
    return None if fraction is None else round(fraction * 100)


@register.filter
def progress_label(progress: Any) -> str:
    if not isinstance(progress, dict) or not progress:
        return "—"
    step = progress.get("step")
    total = next((progress[k] for k in _TOTAL_KEYS if progress.get(k) is not None), None)
    fraction = progress_fraction(progress)
    if step is not None and total is not None:
        return f"{step}/{total}"
    if step is not None:
        return f"step {step}"
    if fraction is not None:
        return f"{round(fraction * 100)}%"
    return "—"


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
