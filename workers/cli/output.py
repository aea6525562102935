"""What the CLI prints: rich tables for people, plain JSON for scripts (``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console as RichConsole
from rich.table import Table

out = RichConsole(soft_wrap=True)
# Piped into a file or another program: tables as wide as their content, not cut at 80 columns.
if not out.is_terminal:
    out = RichConsole(soft_wrap=True, width=1000)
err = RichConsole(stderr=True, soft_wrap=True)

JOB_HEADER = ["ID", "NAME", "STATE", "NODES", "WORLD", "ROUND", "RESTARTS", "STEP", "ON"]
NODE_HEADER = ["ID", "NAME", "STATE", "ADDRESS", "SLOTS", "GPUS", "CPU", "MEM", "LAST HEARTBEAT"]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(rows: Iterable[Sequence[Any]], header: Sequence[str], title: str | None = None) -> Table:
    grid = Table(*header, title=title, box=None, header_style="bold", pad_edge=False)
    for row in rows:
        grid.add_row(*("-" if cell is None or cell == "" else str(cell) for cell in row))
    return grid


def when(value: Any) -> str | None:
    """An API timestamp for people: local time to the second."""
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def progress_text(job: dict[str, Any]) -> str:
    """The job's progress as the console shows it: ``1,200/4,000 steps``, ``3,072,000/4,608,000
    examples`` (a parameter-server job), ``step 1,200`` (no total)."""
    progress = job.get("progress") or {}
    step, total = progress.get("step"), progress.get("total")
    unit = progress.get("unit") or "steps"
    if not isinstance(step, int):
        return "-"
    if isinstance(total, int) and total > 0:
        return f"{step:,}/{total:,} {unit}"
    return f"step {step:,}" if unit == "steps" else f"{step:,} {unit}"


def job_rows(jobs: Iterable[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j.get("id"),
            j.get("name"),
            j.get("state"),
            j.get("nnodes"),
            j.get("world_size"),
            j.get("round"),
            f"{j.get('restarts')}/{j.get('max_restarts')}",
            progress_text(j),
            ",".join(j.get("nodes") or []),
        ]
        for j in jobs
    ]


def percent(value: Any) -> str:
    return f"{value:.0f}%" if isinstance(value, int | float) else "-"


def node_rows(nodes: Iterable[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            n.get("id"),
            n.get("name"),
            n.get("state"),
            n.get("address"),
            n.get("slots"),
            len(n.get("gpus") or []),
            percent(n.get("cpu_percent")),
            percent(n.get("memory_percent")),
            when(n.get("last_heartbeat")),
        ]
        for n in nodes
    ]
