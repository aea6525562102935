from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "console.api"
    label = "api"
