"""Print a one-time join token for a node (console/cluster/tokens.py), for an agent started
without the web UI at hand: the compose file's agent, a provisioning script.

    python manage.py jointoken --node gpu-1 [--hours 24]

The token enrols only the node it names, once, before it expires; it is shown only here.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.cluster import tokens
from console.core.models import AuditEntry


class Command(BaseCommand):
    help = "Print a one-time join token that enrols the named node."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node", required=True, help="the node it enrols (the agent's --name)")
        parser.add_argument("--hours", type=float, default=tokens.DEFAULT_JOIN_TOKEN_HOURS)

    def handle(self, *args: Any, node: str, hours: float, **options: Any) -> None:
        if not 0 < hours <= tokens.MAX_JOIN_TOKEN_HOURS:
            raise CommandError(f"--hours must be in (0, {tokens.MAX_JOIN_TOKEN_HOURS}]")
        token, raw = tokens.issue_join_token(
            None, f"manage.py jointoken for {node}", node_name=node, hours=hours
        )
        AuditEntry.record_raw(
            None,
            "node.join_token_created",
            target_type="jointoken",
            target_id=str(token.pk),
            actor_name="manage.py jointoken",
            node=node,
        )
        self.stdout.write(raw)
