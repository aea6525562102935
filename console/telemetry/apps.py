from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "console.telemetry"
    label = "telemetry"
