"""``trainyard nodes``, ``drain``, ``undrain`` and ``top``."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live

from workers.cli.base import (
    FOLLOW_INTERVAL,
    JsonOption,
    OutputOption,
    app,
    console,
    wants_json,
)
from workers.cli.client import (
    Console,
)
from workers.cli.errors import CliError, Exit
from workers.cli.output import JOB_HEADER, NODE_HEADER, job_rows, node_rows, out, print_json, table


@app.command()
def nodes(json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Cluster nodes (every page)."""
    items = console().all("nodes/")
    if wants_json(json_flag, output):
        print_json(items)
    else:
        out.print(table(node_rows(items), NODE_HEADER))


def node_id(session: Console, node: str) -> int:
    if node.isdigit():
        return int(node)
    for item in session.pages("nodes/"):
        if item.get("name") == node:
            return int(item["id"])
    raise CliError(f"No node named {node!r}.", Exit.NOT_FOUND)


def node_action(node: str, action: str, as_json: bool) -> None:
    session = console()
    item = session.post(f"nodes/{node_id(session, node)}/{action}/")
    if as_json:
        print_json(item)
    else:
        out.print(f"Node {item['name']}: {item['state']}", highlight=False)


NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="The node's name or id.")]


@app.command()
def drain(node: NodeArg, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Drain a node: its jobs move off it and nothing new is placed there."""
    node_action(node, "drain", wants_json(json_flag, output))


@app.command()
def undrain(node: NodeArg, json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Put a drained node back in service."""
    node_action(node, "undrain", wants_json(json_flag, output))


@app.command()
def top(
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and end.")] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Live view of nodes, running and pending jobs."""
    session = console()
    as_json = wants_json(json_flag, output)

    def snapshot() -> dict[str, Any]:
        return {
            "nodes": session.all("nodes/"),
            "running": session.all("jobs/", 50, state="RUNNING"),
            "pending": session.all("jobs/", 50, state="PENDING"),
        }

    def render(data: dict[str, Any]) -> Group:
        gpus = sum(len(n.get("gpus") or []) for n in data["nodes"])
        return Group(
            f"trainyard top — {session.url} — {time.strftime('%H:%M:%S')} — {len(data['nodes'])} nodes, {gpus} GPUs",
            table(node_rows(data["nodes"]), NODE_HEADER, title="Nodes"),
            table(job_rows(data["running"]), JOB_HEADER, title="Running"),
            table(job_rows(data["pending"]), JOB_HEADER, title="Pending"),
        )

    if as_json:
        print_json(snapshot())
        return
    if once or not out.is_terminal:
        out.print(render(snapshot()))
        return
    with Live(render(snapshot()), console=out, refresh_per_second=2, screen=True) as live:
        while True:
            time.sleep(2 * FOLLOW_INTERVAL)
            live.update(render(snapshot()))
