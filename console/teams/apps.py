"""The Django app config."""

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_default_workspace(sender: AppConfig, **kwargs: Any) -> None:
    """The default workspace exists whenever the schema does: made by migration teams.0001, and
    again after a flush (post_migrate), as the role groups are (console/core/apps.py)."""
    from console.teams.models import default_workspace_id

    default_workspace_id()


class TeamsConfig(AppConfig):
    name = "console.teams"
    label = "teams"
    verbose_name = "Workspaces and quotas"

    def ready(self) -> None:
        from console.teams import receivers  # noqa: F401  (membership and quota audit)

        post_migrate.connect(
            ensure_default_workspace, sender=self, dispatch_uid="trainyard-default-workspace"
        )
