"""Roles: Django groups ``operator`` (may change jobs) and ``viewer`` (read-only); staff run admin."""

from __future__ import annotations

from typing import Any

OPERATOR = "operator"
VIEWER = "viewer"


def is_operator(user: Any) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name=OPERATOR).exists()


def can_view(user: Any) -> bool:
    """Every signed-in user of the console may look; anonymous users may not."""
    return bool(getattr(user, "is_authenticated", False) and user.is_active)
