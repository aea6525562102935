from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "console.web"
    label = "web"
