"""The Django app config."""

from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "console.experiments"
    label = "experiments"
