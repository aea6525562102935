"""The controller's decisions. Filled in by the controller work."""

from __future__ import annotations


def reconcile() -> None:
    return None
