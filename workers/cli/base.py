"""The ``trainyard`` typer app and what its commands share: options, JSON or table output, the
console session."""

from __future__ import annotations

from typing import Annotated

import typer

from workers.cli.client import (
    Console,
)
from workers.cli.errors import EXIT_CODES_HELP, CliError, Exit

FOLLOW_INTERVAL = 1.0
FINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")

app = typer.Typer(
    name="trainyard",
    help=(
        "The Trainyard console from a terminal, over its REST API.\n\n"
        "Credentials live in ~/.config/trainyard/config.json (mode 600; TRAINYARD_CONFIG moves it); "
        "TRAINYARD_URL and TRAINYARD_TOKEN override them.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of a table.")]
OutputOption = Annotated[
    str | None, typer.Option("--output", "-o", help="'json' is the same as --json; 'table' is the default.")
]
JobId = Annotated[int, typer.Argument(help="The job's id.", min=1)]
LimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, help="At most this many (default: every page).")
]


def wants_json(flag: bool, output: str | None) -> bool:
    if output not in (None, "json", "table"):
        raise CliError(f"--output must be 'json' or 'table', not {output!r}", Exit.USAGE)
    return flag or output == "json"


def console() -> Console:
    return Console.from_config()


# --- login, logout, tokens --------------------------------------------------------------------
