from django.urls import path

from console.web import views
from console.web.alerts_page import alerts_page
from console.web.quotas import quotas_page

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("live/", views.cluster_live, name="cluster_live"),
    path("jobs/", views.job_list, name="job_list"),
    path("jobs/new/", views.job_submit, name="job_submit"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/live/", views.job_live, name="job_live"),
    path("nodes/", views.node_list, name="node_list"),
    path("alerts/", alerts_page, name="alerts_page"),
    path("quotas/", quotas_page, name="quotas"),
    path("network/", views.network_view, name="network_view"),
    path("nodes/<slug:name>/", views.node_detail, name="node_detail"),
    # A page (it sends anonymous users to the login form), so not under /api/, where every
    # endpoint answers machines with 401/403.
    path("api-docs/", views.api_docs, name="api_docs"),
]
