"""Print the console's public command key (workers/signing.py), for an agent that is given it by
config (``--console-key`` / ``TRAINYARD_CONSOLE_KEY``) rather than learning it at enrolment.

The key is public: agents verify commands with it; only the console's private half (in
``settings.COMMAND_KEY_FILE``) can seal them.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from console.core.transport import command_signer


class Command(BaseCommand):
    help = "Print the console's public command key (what an agent's --console-key takes)."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(command_signer().public_key)
