"""The Django app config."""

from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "console.teams"
    label = "teams"
    verbose_name = "Workspaces and quotas"

    def ready(self) -> None:
        from console.teams import receivers  # noqa: F401  (membership and quota audit)
