"""The ``trainyard`` commands (typer), one module per area: ``account`` (login, logout, tokens),
``submit`` (submit, bundle), ``jobs`` (ls, show, scale, restart, stop), ``watch`` (logs, events,
checkpoints, metrics), ``nodes`` (nodes, drain, undrain, top), ``experiments`` (compare, sweep ...); ``base`` holds the app and the
options they share. See workers/cli/__init__.py for an overview."""

from __future__ import annotations

from workers.cli import account, experiments, jobs, network, nodes, submit, watch  # noqa: F401  (each registers its commands)
from workers.cli.account import token_from_password
from workers.cli.base import app
from workers.cli.submit import load_spec

__all__ = ["app", "load_spec", "token_from_password"]
