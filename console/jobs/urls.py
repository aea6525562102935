"""URLs of the job API (/api/v1/jobs/), and workspaces and quotas (/api/v1/workspaces/, /api/v1/quotas/)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from console.jobs.api import JobViewSet
from console.jobs.hang_api import HangsView
from console.jobs.workspace_api import QuotaList, WorkspaceList, WorkspaceMember, WorkspaceMembers

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("jobs/<int:job_id>/hangs/", HangsView.as_view(), name="job-hangs"),
    *router.urls,
    path("workspaces/", WorkspaceList.as_view(), name="workspace-list"),
    path("workspaces/<slug:name>/members/", WorkspaceMembers.as_view(), name="workspace-members"),
    path(
        "workspaces/<slug:name>/members/<str:username>/", WorkspaceMember.as_view(), name="workspace-member"
    ),
    path("quotas/", QuotaList.as_view(), name="quota-list"),
]
