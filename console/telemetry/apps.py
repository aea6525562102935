from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "console.telemetry"
    label = "telemetry"

    def ready(self) -> None:
        from console.core import events as reporting
        from console.telemetry import events

        # The apps below this one (core, cluster, jobs) report through console/core/events.py.
        reporting.provide(events)
