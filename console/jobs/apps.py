"""The Django app config."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "console.jobs"
    label = "jobs"
