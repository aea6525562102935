"""The roles of a ``parameter_server`` job: M PS processes and N workers, checked and normalised.

A spec gives them as ``roles: {ps: {count: 2, mode: async}, worker: {count: 3, min: 1, max: 8}}``;
the job stores the normalised form (every key present). The PS role also runs the job's one
coordinator (data shards with leases, workers/ps/coordinator.py), placed with it. Pure: no
database, so the API, the CLI's checks and the planning tests share it.
"""

from __future__ import annotations

from typing import Any

PS = "ps"
WORKER = "worker"
COORDINATOR = "coordinator"
# hybrid: a worker change replaces every worker by a new dense group (parameter_server.py)
MODES = ("async", "sync", "hybrid")
MAX_PS = 64
MAX_WORKERS = 1024


class RolesError(ValueError):
    """The roles are not valid; the message says which field and why."""


def _count(role: str, body: dict[str, Any], key: str, default: int | None, low: int, high: int) -> int:
    value = body.get(key, default)
    if value is None:
        raise RolesError(f"roles.{role}.{key} is required.")
    if isinstance(value, bool) or not isinstance(value, int):
        raise RolesError(f"roles.{role}.{key} must be a whole number, got {value!r}.")
    if not low <= value <= high:
        raise RolesError(f"roles.{role}.{key} must be between {low} and {high}, got {value}.")
    return value


def normalize(roles: Any) -> dict[str, dict[str, Any]]:
    """``roles`` as stored: {"ps": {"count", "mode"}, "worker": {"count", "min", "max"}}.
    Raises RolesError naming the first bad field."""
    if not isinstance(roles, dict):
        raise RolesError("roles must be a mapping like {ps: {count: 2}, worker: {count: 3}}.")
    unknown = sorted(set(roles) - {PS, WORKER})
    if unknown:
        raise RolesError(f"Unknown role(s) {', '.join(map(repr, unknown))}; the roles are 'ps' and 'worker'.")
    for role in (PS, WORKER):
        if not isinstance(roles.get(role), dict):
            raise RolesError(f"roles.{role} is required, e.g. {{count: 2}}.")
    ps, worker = roles[PS], roles[WORKER]
    extra = sorted(set(ps) - {"count", "mode"}) + sorted(set(worker) - {"count", "min", "max"})
    if extra:
        raise RolesError(f"Unknown role field(s): {', '.join(extra)}.")
    ps_count = _count(PS, ps, "count", None, 1, MAX_PS)
    mode = ps.get("mode", "async")
    if mode not in MODES:
        raise RolesError(f"roles.ps.mode must be one of {', '.join(MODES)}, got {mode!r}.")
    count = _count(WORKER, worker, "count", None, 1, MAX_WORKERS)
    low = _count(WORKER, worker, "min", 1, 1, MAX_WORKERS)
    high = _count(WORKER, worker, "max", max(count, low), 1, MAX_WORKERS)
    if low > high:
        raise RolesError(f"roles.worker.min ({low}) is larger than roles.worker.max ({high}).")
    if not low <= count <= high:
        raise RolesError(f"roles.worker.count ({count}) must be within min..max ({low}..{high}).")
    return {
        PS: {"count": ps_count, "mode": mode},
        WORKER: {"count": count, "min": low, "max": high},
    }


def resized(roles: dict[str, dict[str, Any]], role: str, count: int) -> dict[str, dict[str, Any]]:
    """``roles`` with ``role``'s count set to ``count``; RolesError when out of its range."""
    if role == WORKER:
        low, high = roles[WORKER]["min"], roles[WORKER]["max"]
        if not low <= count <= high:
            raise RolesError(f"The worker role takes {low}..{high} processes; {count} is outside.")
    elif role == PS:
        if not 1 <= count <= MAX_PS:
            raise RolesError(f"The ps role takes 1..{MAX_PS} processes; {count} is outside.")
    else:
        raise RolesError(f"Unknown role {role!r}; the roles are 'ps' and 'worker'.")
    return {**roles, role: {**roles[role], "count": count}}
