"""The Django app config."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "console.jobs"
    label = "jobs"

    def ready(self) -> None:
        from console.jobs import node_changes

        node_changes.connect()  # what a node's news (console/cluster/hooks.py) means for jobs
