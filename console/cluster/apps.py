"""The Django app config."""

from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "console.cluster"
    label = "cluster"
