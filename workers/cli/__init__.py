"""``trainyard``: the console from a terminal, over the REST API (no Django needed).

    trainyard login --url http://console:8000 --username olivia      # asks for the password
    trainyard logout                                                  # revokes the token
    trainyard submit job.yaml [--set nproc_per_node=2] [--bundle ./src [--exclude 'data/']]
    trainyard ls [--state RUNNING] [--json]      trainyard show 12
    trainyard scale 12 3    trainyard restart 12    trainyard stop 12
    trainyard scale 12 4 --role worker   (a parameter_server job: its worker or ps role)
    trainyard logs 12 [--rank 0] [--grep loss] [-f]   trainyard events 12   trainyard checkpoints 12
    trainyard metrics 12 [--name loss] [--follow]
    trainyard nodes    trainyard drain gpu-01    trainyard undrain gpu-01    trainyard top
    trainyard tokens   trainyard bundle ./src

Modules: ``app`` (the typer commands, from ``account``, ``submit``, ``jobs``, ``watch``, ``nodes``
on ``base``), ``client`` (httpx, credentials, pagination), ``bundle``
(the archive a directory becomes), ``output`` (rich tables, JSON), ``errors`` (exit codes).
``main`` runs a command and turns every error into one line on stderr and an exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main", "token_from_password"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns its exit code (see workers/cli/errors.py)."""
    import httpx
    import typer

    from workers.cli.app import app
    from workers.cli.errors import CliError, Exit

    command = typer.main.get_command(app)
    try:
        # Standalone: typer shows usage errors (exit 2) and help itself, and exits.
        command.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="trainyard")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else int(Exit.ERROR))
    except CliError as error:
        print(f"trainyard: {error}", file=sys.stderr)
        return int(error.code)
    except KeyboardInterrupt:
        return int(Exit.INTERRUPTED)
    except httpx.HTTPError as error:  # a transport failure a command did not wrap
        print(f"trainyard: cannot talk to the console: {error}", file=sys.stderr)
        return int(Exit.UNREACHABLE)
    except BrokenPipeError:
        return int(Exit.OK)
    except OSError as error:  # the local disk or a file: not the CLI's bug
        where = f" ({error.filename})" if error.filename else ""
        print(f"trainyard: {error.strerror or error}{where}", file=sys.stderr)
        return int(Exit.ERROR)
    except Exception as error:
        if os.environ.get("TRAINYARD_DEBUG"):
            raise
        print(
            f"trainyard: unexpected error: {type(error).__name__}: {error} (TRAINYARD_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        return int(Exit.ERROR)
    return int(Exit.OK)


def token_from_password(url: str, username: str, password: str) -> str:
    """This host's CLI token for ``username`` (replacing the one an earlier login made)."""
    from workers.cli.app import token_from_password as exchange

    return exchange(url, username, password)
