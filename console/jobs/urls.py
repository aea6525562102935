"""URLs of the job API (/api/v1/jobs/)."""

from rest_framework.routers import SimpleRouter

from console.jobs.api import JobViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = router.urls
