"""REST API for nodes (/api/v1/nodes/): the inventory for everyone, drain and undrain for operators,
join tokens for operators, and enrolment (an agent trading a join token for its own credential)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api import lockout
from console.api.models import ApiToken, Scope
from console.api.views import token_name_field
from console.cluster import actions, network, tokens
from console.cluster.models import Gpu, JoinToken, NetworkCheck, Node, NodeLink
from console.core.models import AuditEntry
from console.core.roles import is_operator
from console.core.transport import command_signer


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
            "interface",
            "state",
            "cpus",
            "memory_bytes",
            "slots",
            "cpu_percent",
            "memory_percent",
            "agent_version",
            "agent_protocol",
            "torch_version",
            "last_heartbeat",
            "registered_at",
            "gpus",
        ]
        read_only_fields = fields


RECENT_CHECKS = 20


class NetworkCheckSerializer(serializers.ModelSerializer):
    done = serializers.BooleanField(read_only=True)
    silent = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = NetworkCheck
        fields = [
            "id",
            "reason",
            "created_at",
            "deadline_at",
            "finished_at",
            "done",
            "nodes",
            "silent",
            "results",
        ]
        read_only_fields = fields


class NodeLinkSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="source.name", read_only=True, help_text="The node that probed")
    peer = serializers.CharField(source="target.name", read_only=True, help_text="The node it probed")
    check_id = serializers.IntegerField(source="check_run_id", read_only=True)

    class Meta:
        model = NodeLink
        fields = ["node", "peer", "ok", "latency_ms", "bandwidth_mbps", "error", "checked_at", "check_id"]
        read_only_fields = fields


class NetworkViewSerializer(serializers.Serializer):
    links = NodeLinkSerializer(many=True)
    checks = NetworkCheckSerializer(many=True)


class NetworkCheckRequestSerializer(serializers.Serializer):
    nodes = serializers.ListField(
        child=serializers.SlugField(max_length=64),
        required=False,
        max_length=1000,
        help_text="Node names to check together; every node that is up when left out.",
    )


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

    @extend_schema(request=None, responses={202: NetworkCheckSerializer})
    @action(detail=True, methods=["post"], url_path="check-network")
    def check_network(self, request: Request, pk: str) -> Response:
        """A pre-flight network check of this node against every other node that is up."""
        node = self.get_object()
        check = network.request_check(
            [node, *(n for n in network.online_nodes() if n.pk != node.pk)],
            NetworkCheck.Reason.OPERATOR,
            hub=node,
            user=request.user,
        )
        AuditEntry.record(request.user, "node.network_checked", node, check=check.pk)
        return Response(NetworkCheckSerializer(check).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=NetworkCheckRequestSerializer,
        responses={200: NetworkViewSerializer, 202: NetworkCheckSerializer},
    )
    @action(detail=False, methods=["get", "post"])
    def network(self, request: Request) -> Response:
        """GET: every node pair's latest pre-flight result and the recent checks (``?check=ID``:
        that one only). POST ``{"nodes": [names]}`` (default: every node that is up): check them."""
        if request.method == "POST":
            given = NetworkCheckRequestSerializer(data=request.data)
            given.is_valid(raise_exception=True)
            names = given.validated_data.get("nodes") or None
            nodes = network.online_nodes(names)
            if names:
                unknown = sorted(set(names) - {n.name for n in nodes})
                if unknown:
                    raise serializers.ValidationError(
                        {"nodes": [f"not known or not up: {', '.join(unknown)}"]}
                    )
            check = network.request_check(nodes, NetworkCheck.Reason.OPERATOR, user=request.user)
            AuditEntry.record(request.user, "node.network_checked", None, check=check.pk, nodes=check.nodes)
            return Response(NetworkCheckSerializer(check).data, status=status.HTTP_202_ACCEPTED)
        checks = NetworkCheck.objects.all()
        wanted = request.query_params.get("check")
        if wanted is not None:
            if not wanted.isdigit():
                raise serializers.ValidationError({"check": ["a check id (a number)"]})
            checks = checks.filter(pk=int(wanted))
        links = NodeLink.objects.select_related("source", "target")
        return Response(
            {
                "links": NodeLinkSerializer(links, many=True).data,
                "checks": NetworkCheckSerializer(checks[:RECENT_CHECKS], many=True).data,
            }
        )

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, pk: str) -> Response:
        node = actions.undrain_node(self.get_object().pk, request.user)
        return Response(NodeSerializer(node).data)


class JoinTokenSerializer(serializers.ModelSerializer):
    expired = serializers.BooleanField(read_only=True)
    # Plain strings: "" (any node; not used yet) is not a slug.
    node_name = serializers.CharField(
        read_only=True, help_text="Only this node may enrol with it; any when empty."
    )
    used_by = serializers.CharField(
        read_only=True, help_text="The node that enrolled with it; empty while unused."
    )

    class Meta:
        model = JoinToken
        fields = [
            "id",
            "name",
            "prefix",
            "node_name",
            "created_at",
            "expires_at",
            "expired",
            "used_at",
            "used_by",
        ]
        read_only_fields = fields


class NewJoinTokenSerializer(JoinTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The join token: shown this once, never again.")

    class Meta(JoinTokenSerializer.Meta):
        fields = [*JoinTokenSerializer.Meta.fields, "token"]


class JoinTokenRequestSerializer(serializers.Serializer):
    name = token_name_field()
    node_name = serializers.SlugField(
        max_length=64, required=False, allow_blank=True, help_text="Only this node may enrol with it."
    )
    expires_in_hours = serializers.FloatField(
        required=False,
        min_value=0.01,
        max_value=tokens.MAX_JOIN_TOKEN_HOURS,
        help_text=f"Default: {tokens.DEFAULT_JOIN_TOKEN_HOURS}.",
    )


class MayManageJoinTokens(permissions.BasePermission):
    """Operators; with an API token, ``read`` to list and ``nodes:write`` or ``admin`` to create."""

    message = "Only members of the 'operator' group may manage join tokens."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not is_operator(request.user):
            return False
        token = request.auth if isinstance(request.auth, ApiToken) else None
        writes = request.method not in permissions.SAFE_METHODS
        if (
            token is not None
            and writes
            and not (token.allows(Scope.NODES_WRITE) or token.allows(Scope.ADMIN))
        ):
            raise exceptions.PermissionDenied("This token lacks the 'nodes:write' or 'admin' scope.")
        return True


class JoinTokenList(APIView):
    """One-time tokens with which a new host enrols (README: "Adding a host")."""

    permission_classes = [MayManageJoinTokens]

    def required_scope_for(self, request: Request) -> str | None:
        # Creating needs nodes:write or admin, which MayManageJoinTokens checks.
        return Scope.READ if request.method in permissions.SAFE_METHODS else None

    @extend_schema(responses={200: JoinTokenSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(JoinTokenSerializer(JoinToken.objects.all()[:200], many=True).data)

    @extend_schema(request=JoinTokenRequestSerializer, responses={201: NewJoinTokenSerializer})
    def post(self, request: Request) -> Response:
        given = JoinTokenRequestSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        token, raw = tokens.issue_join_token(
            request.user,
            given.validated_data["name"],
            given.validated_data.get("node_name", ""),
            given.validated_data.get("expires_in_hours", tokens.DEFAULT_JOIN_TOKEN_HOURS),
        )
        AuditEntry.record(
            request.user, "node.join_token_created", token, name=token.name, node=token.node_name
        )
        data = NewJoinTokenSerializer(token).data
        data["token"] = raw
        return Response(data, status=status.HTTP_201_CREATED)


class EnrolRequestSerializer(serializers.Serializer):
    name = serializers.SlugField(max_length=64, help_text="The node's name (the agent's --name).")
    join_token = serializers.CharField(max_length=200)


class EnrolResponseSerializer(serializers.Serializer):
    name = serializers.CharField()
    secret = serializers.CharField(help_text="The node's own credential; the agent stores it.")
    command_key = serializers.CharField(
        help_text="The console's public Ed25519 key: the agent runs only commands it verifies."
    )


class Enrol(APIView):
    """An agent trades a join token for its node's own credential. The join token is the proof."""

    authentication_classes: list[Any] = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=EnrolRequestSerializer, responses={201: EnrolResponseSerializer})
    def post(self, request: Request) -> Response:
        lockout.check_address_lockout(request)
        given = EnrolRequestSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        name = given.validated_data["name"]
        try:
            _, secret = tokens.enrol(name, given.validated_data["join_token"])
        except tokens.EnrolmentRefused as refused:
            tokens.record_refused_enrolment(name, given.validated_data["join_token"], str(refused))
            lockout.address_failed(request)
            raise exceptions.PermissionDenied(str(refused)) from None
        return Response(
            {"name": name, "secret": secret, "command_key": command_signer().public_key},
            status=status.HTTP_201_CREATED,
        )
