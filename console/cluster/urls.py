"""URLs of the node API (/api/v1/nodes/)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from console.cluster.api import Enrol, JoinTokenList, NodeViewSet

router = SimpleRouter()
router.register("nodes", NodeViewSet, basename="node")

# Before the router's, whose nodes/<pk>/ would take these names as node ids.
urlpatterns = [
    path("nodes/join-tokens/", JoinTokenList.as_view(), name="node-join-tokens"),
    path("nodes/enroll/", Enrol.as_view(), name="node-enroll"),
    *router.urls,
]
