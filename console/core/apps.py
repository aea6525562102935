"""The Django app config."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "console.core"
    label = "core"
    verbose_name = "Trainyard"

    def ready(self) -> None:
        from console.core import admin_actions, receivers  # noqa: F401  (connects the audit receivers)

        admin_actions.install()
