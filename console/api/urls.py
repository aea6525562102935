from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("v1/", include("console.jobs.urls")),
    path("v1/", include("console.jobs.bundle_urls")),
    path("v1/", include("console.telemetry.urls")),
]
