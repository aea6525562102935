from django.urls import URLPattern, path

from console.telemetry import api, goodput_api
from console.telemetry.log_stream import LogStreamView
from console.telemetry.role_series import RoleSeriesView

urlpatterns: list[URLPattern] = [
    path("jobs/<int:job_id>/metrics/", api.MetricsView.as_view(), name="job-metrics"),
    path("jobs/<int:job_id>/metrics/ranks/", api.RanksView.as_view(), name="job-metrics-ranks"),
    path("jobs/<int:job_id>/metrics/roles/", api.RoleStatsView.as_view(), name="job-metrics-roles"),
    path(
        "jobs/<int:job_id>/metrics/roles/series/",
        RoleSeriesView.as_view(),
        name="job-metrics-role-series",
    ),
    path("jobs/<int:job_id>/events/", api.EventsView.as_view(), name="job-events"),
    path("jobs/<int:job_id>/logs/", api.LogsView.as_view(), name="job-logs"),
    path("jobs/<int:job_id>/logs/stream/", LogStreamView.as_view(), name="job-logs-stream"),
    path("jobs/<int:job_id>/checkpoints/", api.CheckpointsView.as_view(), name="job-checkpoints"),
    path("jobs/<int:job_id>/goodput/", goodput_api.JobGoodputView.as_view(), name="job-goodput"),
    path("goodput/", goodput_api.ClusterGoodputView.as_view(), name="cluster-goodput"),
]
