"""Reading a hang's stacks (pure: no database): where each rank is, ranks grouped by identical
stack ("ranks 0-1 in backward at train.py:41, rank 2 in __next__ at train.py:38"), and which ranks
are at fault.

A stack is a rank's main thread, innermost frame first (protocol.ThreadStack). Its *label* is the
innermost frame, and where the script itself is (the innermost frame outside torch, the SDK and the
standard library) when that is another frame.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Frames that wait for the other ranks: torch.distributed's collectives, and backward (DDP's
# gradient all-reduce runs inside it).
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "allreduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "gather",
        "scatter",
        "send",
        "recv",
        "backward",
        "_engine_run_backward",
        "_sync_buffers",
        "_sync_params_and_buffers",
    }
)
LIBRARY_PREFIXES = ("torch/", "numpy/", "workers/sdk/", "workers/agent/", "<frozen", "importlib/")
STOPPED = ("stopped", "tracing-stop")


def _frames(stack: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The main thread's Python frames (native ones, where py-spy read them, are left out: they
    tell apart stacks the script cannot)."""
    threads = stack.get("threads") or []
    frames = threads[0]["frames"] if threads else []
    return [f for f in frames if str(f["file"]).endswith(".py") or str(f["file"]).startswith("<")]


def is_library(file: str) -> bool:
    if file.startswith(LIBRARY_PREFIXES):
        return True
    stem = file.split("/", 1)[0].removesuffix(".py")
    return stem in sys.stdlib_module_names


def label(stack: Mapping[str, Any]) -> str:
    """Where a rank is, in a few words."""
    stopped = stack.get("process_state") in STOPPED
    frames = _frames(stack)
    if not frames:
        why = stack.get("error") or "no Python stack"
        return f"stopped ({why})" if stopped else f"unknown ({why})"
    inner = frames[0]
    user = next((f for f in frames if not is_library(str(f["file"]))), None)
    if user is None or user is inner:
        where = f"{inner['name']} at {inner['file']}:{inner['line']}"
    else:
        where = f"{inner['name']} at {user['file']}:{user['line']}"
    return f"stopped in {where}" if stopped else f"in {where}"


def in_collective(stack: Mapping[str, Any]) -> bool:
    return any(
        f["name"] in COLLECTIVES or str(f["file"]).startswith("torch/distributed/") for f in _frames(stack)
    )


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "no rank"
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(parts)


@dataclass(frozen=True)
class Group:
    ranks: tuple[int, ...]
    label: str
    frames: tuple[Mapping[str, Any], ...]  # the shared main-thread stack, innermost first

    @property
    def text(self) -> str:
        return f"{rank_ranges(self.ranks)} {self.label}"


def group(stacks: Sequence[Mapping[str, Any]]) -> list[Group]:
    """Ranks with the same main-thread stack (and the same stopped-or-not) together, the largest
    group first."""
    found: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for stack in stacks:
        key = (
            stack.get("process_state") in STOPPED,
            tuple((f["name"], f["file"], f["line"]) for f in _frames(stack)),
            "" if _frames(stack) else str(stack.get("error") or ""),
        )
        found.setdefault(key, []).append(stack)
    groups = [
        Group(tuple(sorted(int(s["rank"]) for s in members)), label(members[0]), tuple(_frames(members[0])))
        for members in found.values()
    ]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


def culprits(stacks: Sequence[Mapping[str, Any]], stalled: Iterable[int] = ()) -> tuple[list[int], str]:
    """The ranks at fault and why, most certain first: ranks behind the furthest step; ranks whose
    process is stopped; ranks outside any collective while others wait in one; else the ranks the
    hosts saw stalled (every rank waits: the cause is not in one rank's stack)."""
    steps = {int(s["rank"]): s["step"] for s in stacks if s.get("step") is not None}
    if steps:
        ahead = max(steps.values())
        behind = sorted(rank for rank, step in steps.items() if step < ahead)
        missing = sorted(int(s["rank"]) for s in stacks if s.get("step") is None)
        if behind or missing:
            return sorted(behind + missing), f"did not reach step {ahead}"
    stopped = sorted(int(s["rank"]) for s in stacks if s.get("process_state") in STOPPED)
    if stopped:
        return stopped, "process stopped"
    waiting = [s for s in stacks if in_collective(s)]
    if waiting and len(waiting) < len(stacks):
        return sorted(
            int(s["rank"]) for s in stacks if not in_collective(s)
        ), "not in a collective its peers wait in"
    named = sorted(set(stalled)) or sorted(int(s["rank"]) for s in stacks)
    return named, "no progress"


def summary(stacks: Sequence[Mapping[str, Any]], stalled: Iterable[int] = ()) -> str:
    ranks, why = culprits(stacks, stalled)
    where = "; ".join(g.text for g in group(stacks))
    return (
        f"{rank_ranges(ranks).capitalize()}: {why}. {where}"
        if stacks
        else f"{rank_ranges(ranks).capitalize()}: {why}"
    )
