"""The Django app config."""

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "console.core"
    label = "core"
    verbose_name = "Trainyard"
