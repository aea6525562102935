from django.urls import URLPattern, path

from console.telemetry.consumers import ClusterConsumer, JobConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
    path("ws/cluster/", ClusterConsumer.as_asgi()),
]
