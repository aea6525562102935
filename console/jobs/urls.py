from rest_framework.routers import SimpleRouter

from console.jobs.api import JobViewSet, NodeViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("nodes", NodeViewSet, basename="node")

urlpatterns = router.urls
