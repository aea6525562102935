"""Create the first admin: staff, superuser, and member of the operator group.

The password comes from --password, else TRAINYARD_ADMIN_PASSWORD, else it is generated and
printed once. Running it again leaves an existing admin alone, so `bin/run` can call it on
every start.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from console.core.roles import OPERATOR


class Command(BaseCommand):
    help = "Create the first Trainyard admin (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--password", default=None, help="Default: $TRAINYARD_ADMIN_PASSWORD, else generated"
        )

    def handle(self, *args: Any, username: str, email: str, password: str | None, **options: Any) -> None:
        User = get_user_model()
        with transaction.atomic():
            if User.objects.filter(username=username).exists():
                self.stdout.write(f"Admin {username!r} already exists; left unchanged.")
                return
            given = password or os.environ.get("TRAINYARD_ADMIN_PASSWORD")
            chosen = given or secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, email=email, password=chosen)
            group, _ = Group.objects.get_or_create(name=OPERATOR)
            user.groups.add(group)
        if given:
            self.stdout.write(f"Created admin {username!r} with the given password.")
        else:
            # Printed once: only the hash is stored, so this line is the only copy.
            self.stdout.write(f"Created admin login: username={username} password={chosen}")
