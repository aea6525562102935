from django.urls import URLPattern, URLResolver, path
from rest_framework.routers import SimpleRouter

from console.experiments import api
from console.experiments.export import MetricsExportView

router = SimpleRouter()
router.register("sweeps", api.SweepViewSet, basename="sweep")

urlpatterns: list[URLPattern | URLResolver] = [
    path("compare/", api.CompareView.as_view(), name="compare"),
    path("compare/series/", api.CompareSeriesView.as_view(), name="compare-series"),
    path("jobs/<int:job_id>/metrics/export/", MetricsExportView.as_view(), name="job-metrics-export"),
    *router.urls,
]
