"""The controller's Celery app. Agents use their own app (workers/agent) on the same broker."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    ["console.cluster", "console.jobs", "console.telemetry", "console.experiments", "console.alerts"]
)
