"""Agents' reports as the controller receives them: sealed with a node's secret
(workers/signing.py), for tests that deliver controller tasks themselves."""

from __future__ import annotations

from typing import Any

from workers.signing import SEAL, report_key, seal_report


def sealed(secret: str, task: str, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` with the seal an agent holding ``secret`` would put on ``task``."""
    return {**kwargs, SEAL: seal_report(report_key(secret), task, kwargs)}


def deliver(task: Any, secret: str, **kwargs: Any) -> Any:
    """Runs the controller task ``task`` eagerly on a report sealed with ``secret``."""
    return task.apply(kwargs=sealed(secret, task.name, **kwargs), throw=True)
