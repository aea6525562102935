"""URLs of the node API (/api/v1/nodes/)."""

from rest_framework.routers import SimpleRouter

from console.cluster.api import NodeViewSet

router = SimpleRouter()
router.register("nodes", NodeViewSet, basename="node")

urlpatterns = router.urls
