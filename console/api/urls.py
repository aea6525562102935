from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import SimpleRouter

from console.api.views import TokenViewSet

router = SimpleRouter()
router.register("tokens", TokenViewSet, basename="token")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("v1/", include("console.jobs.urls")),
    path("v1/", include("console.cluster.urls")),
    path("v1/", include("console.jobs.bundle_urls")),
    path("v1/", include("console.telemetry.urls")),
    path("v1/", include(router.urls)),
]
