"""URLs of the job API (/api/v1/jobs/)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from console.jobs.api import JobViewSet
from console.jobs.hang_api import HangsView

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("jobs/<int:job_id>/hangs/", HangsView.as_view(), name="job-hangs"),
    *router.urls,
]
