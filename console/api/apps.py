from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "console.api"
    label = "api"

    def ready(self) -> None:
        from console.api import schema  # noqa: F401  (registers the OpenAPI auth extensions)
