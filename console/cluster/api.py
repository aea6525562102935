"""REST API for nodes (/api/v1/nodes/): the inventory for everyone, drain and undrain for operators."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.models import Scope
from console.cluster import actions
from console.cluster.models import Gpu, Node
from console.core.roles import is_operator


class IsOperatorOrReadOnly(permissions.BasePermission):
    message = "Only members of the 'operator' group may drain nodes."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["index", "name", "uuid", "memory_bytes", "utilization", "memory_used_bytes"]


class NodeSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "hostname",
            "address",
            "state",
            "cpus",
            "memory_bytes",
            "slots",
            "cpu_percent",
            "memory_percent",
            "agent_version",
            "torch_version",
            "last_heartbeat",
            "registered_at",
            "gpus",
        ]
        read_only_fields = fields


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsOperatorOrReadOnly]
    write_scope = Scope.NODES_WRITE
    serializer_class = NodeSerializer
    queryset = Node.objects.prefetch_related("gpus").order_by("name")

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        node = actions.drain_node(self.get_object().pk, request.user)
        return Response(NodeSerializer(node).data)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, pk: str) -> Response:
        node = actions.undrain_node(self.get_object().pk, request.user)
        return Response(NodeSerializer(node).data)
