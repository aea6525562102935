"""``trainyard network check`` and ``trainyard network show``: pre-flight network checks
(console/cluster/network.py) over the API's ``nodes/network/``."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from workers.cli.base import JsonOption, OutputOption, app, console, wants_json
from workers.cli.errors import CliError, Exit
from workers.cli.output import out, print_json, table

network_app = typer.Typer(help="Pre-flight network checks between nodes.", no_args_is_help=True)
app.add_typer(network_app, name="network")

POLL_SECONDS = 0.5
LINK_HEADER = ["FROM", "TO", "REACH", "LATENCY", "BANDWIDTH", "ERROR"]


def link_rows(links: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            link["node"],
            link["peer"],
            "ok" if link["ok"] else "FAILED",
            "-" if link["latency_ms"] is None else f"{link['latency_ms']:.2f} ms",
            "-" if link["bandwidth_mbps"] is None else f"{link['bandwidth_mbps']:.0f} Mbit/s",
            link["error"],
        ]
        for link in links
    ]


def host_lines(check: dict[str, Any]) -> list[str]:
    lines = []
    for name, result in sorted(check.get("results", {}).items()):
        console_part = (
            f"console {result['console_ms']:.1f} ms"
            if result.get("console_ok")
            else (f"console UNREACHABLE ({result.get('console_error', '')})")
        )
        dns = "-" if result.get("dns_ms") is None else f"{result['dns_ms']:.1f} ms"
        reverse = "-" if result.get("reverse_dns_ms") is None else f"{result['reverse_dns_ms']:.1f} ms"
        problems = " ".join(p for p in (result.get("listen_error"), result.get("dns_error")) if p)
        lines.append(
            f"{name}: {console_part}, DNS {dns}, reverse {reverse}, {result.get('seconds', 0):.2f} s {problems}"
        )
    if check.get("silent"):
        lines.append(f"no answer from {', '.join(check['silent'])}")
    return lines


@network_app.command("check")
def check(
    nodes: Annotated[
        list[str] | None,
        typer.Argument(metavar="[NODE]...", help="Nodes to check together (default: every node that is up)."),
    ] = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Start the check and end.")] = False,
    json_flag: JsonOption = False,
    output: OutputOption = None,
) -> None:
    """Check that nodes reach each other (TCP, latency, bandwidth), the console and DNS; exit code 1
    when a link failed."""
    session = console()
    started = session.post("nodes/network/", {"nodes": nodes} if nodes else {})
    check_id = int(started["id"])
    as_json = wants_json(json_flag, output)
    if no_wait:
        print_json(started) if as_json else out.print(
            f"Check {check_id} started over {', '.join(started['nodes'])}"
        )
        return
    deadline = time.monotonic() + 60
    view = session.get("nodes/network/", check=check_id)
    while not view["checks"][0]["done"]:
        if time.monotonic() > deadline:
            raise CliError(f"Check {check_id} did not finish within 60 s.", Exit.ERROR)
        time.sleep(POLL_SECONDS)
        view = session.get("nodes/network/", check=check_id)
    done = view["checks"][0]
    links = [link for link in view["links"] if link["check_id"] == check_id]
    if as_json:
        print_json({"check": done, "links": links})
    else:
        out.print(table(link_rows(links), LINK_HEADER))
        for line in host_lines(done):
            out.print(line, highlight=False)
    if any(not link["ok"] for link in links):
        raise typer.Exit(Exit.ERROR)


@network_app.command("show")
def show(json_flag: JsonOption = False, output: OutputOption = None) -> None:
    """Every node pair's latest check result."""
    view = console().get("nodes/network/")
    if wants_json(json_flag, output):
        print_json(view)
        return
    out.print(table(link_rows(view["links"]), LINK_HEADER))
