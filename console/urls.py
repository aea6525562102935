from django.contrib import admin
from django.urls import include, path

from console.telemetry.prometheus import PrometheusView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("console.api.urls")),
    path("metrics", PrometheusView.as_view(), name="prometheus"),
    path("", include("console.web.urls")),
]
