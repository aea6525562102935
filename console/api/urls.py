from django.urls import include, path, re_path
from rest_framework.routers import SimpleRouter

from console.api.errors import UnknownEndpoint
from console.api.schema import SchemaView
from console.api.views import AuditList, PasswordTokenView, TokenViewSet

router = SimpleRouter()
router.register("tokens", TokenViewSet, basename="token")

urlpatterns = [
    path("schema/", SchemaView.as_view(), name="schema"),
    path("v1/", include("console.jobs.urls")),
    path("v1/", include("console.cluster.urls")),
    path("v1/", include("console.jobs.bundle_urls")),
    path("v1/", include("console.telemetry.urls")),
    path("v1/", include("console.experiments.urls")),
    path("v1/", include("console.alerts.urls")),
    path("v1/", include(router.urls)),
    path("v1/auth/token/", PasswordTokenView.as_view(), name="auth-token"),
    path("v1/audit/", AuditList.as_view(), name="audit-list"),
    # Last: anything else under /api/ is a JSON 404, not the HTML page.
    re_path(r"^.*$", UnknownEndpoint.as_view(), name="api-not-found"),
]
