from django.contrib import admin
from django.urls import include, path

from console.telemetry.prometheus import PrometheusView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("console.api.urls")),
    path("metrics", PrometheusView.as_view(), name="prometheus"),
    path("", include("console.api.page_urls")),
    path("", include("console.web.urls")),
    path("", include("console.experiments.page_urls")),
]

# JSON under /api/, Django's pages elsewhere (console/api/errors.py).
handler400 = "console.api.errors.handler400"
handler403 = "console.api.errors.handler403"
handler404 = "console.api.errors.handler404"
handler500 = "console.api.errors.handler500"
