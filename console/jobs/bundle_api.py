"""REST API for code bundles (/api/v1/bundles/).

Upload (operators), list and detail (signed-in users), and the archive download, which agents
fetch with their node credential as bearer token: a node may fetch only the bundles of jobs it
was given a place in (console/cluster/tokens.py decides whose credential it is).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import FileResponse, Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions, serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.generics import ListAPIView, RetrieveAPIView
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.auth import TokenAuthentication
from console.api.models import Scope
from console.cluster import tokens
from console.core.audit import AuthMethod, mark_auth
from console.core.models import AuditEntry
from console.jobs.bundles import BundleError, bundle_path, store_bundle
from console.jobs.models import Allocation, Bundle
from console.jobs.tenancy import submit_workspace
from console.teams import access
from workers.bundles import UNPACKED_FACTOR

# Multipart framing around the file; a request larger than the limit plus this is refused before
# Django reads its body.
MULTIPART_OVERHEAD = 64 * 1024


class BundleSerializer(serializers.ModelSerializer[Bundle]):
    class Meta:
        model = Bundle
        fields = ["id", "sha256", "size_bytes", "filename", "created_at"]
        read_only_fields = fields


class IsOperatorForUpload(permissions.BasePermission):
    message = "Only editors of a workspace (or members of the 'operator' group) may upload bundles."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or access.acts_anywhere(request.user)


class VisibleBundles:
    """Bundles of the workspaces the caller sees (a node agent: any; its own check follows)."""

    def get_queryset(self) -> QuerySet[Bundle]:
        bundles = Bundle.objects.all()
        user = self.request.user  # type: ignore[attr-defined]
        if isinstance(user, NodeAgent):
            return bundles
        return access.visible(user, bundles, "workspaces").distinct()


class BundleListCreate(VisibleBundles, ListAPIView[Bundle]):
    serializer_class = BundleSerializer
    permission_classes = [IsOperatorForUpload]
    parser_classes = [MultiPartParser, FormParser]
    write_scope = Scope.JOBS_WRITE

    @extend_schema(
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
            }
        },
        responses={201: BundleSerializer},
    )
    def post(self, request: Request) -> Response:
        limit: int = settings.BUNDLE_MAX_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + MULTIPART_OVERHEAD:
            return _refused(f"The bundle is larger than the limit of {limit / (1024 * 1024):.0f} MB.")
        uploaded = request.FILES.get("file")
        if uploaded is None:
            return _refused("Send the archive as the multipart field 'file'.")
        try:
            workspace = submit_workspace(request.user, str(request.POST.get("workspace", "")))
            bundle = store_bundle(uploaded, request.user, workspace)
        except BundleError as error:
            return _refused(str(error))
        AuditEntry.record(
            request.user,
            "bundle.upload",
            bundle,
            sha256=bundle.sha256,
            size_bytes=bundle.size_bytes,
            filename=bundle.filename,
        )
        return Response(BundleSerializer(bundle).data, status=status.HTTP_201_CREATED)


def _refused(message: str) -> Response:
    return Response({"detail": message, "errors": {"file": [message]}}, status=status.HTTP_400_BAD_REQUEST)


class BundleLimitsSerializer(serializers.Serializer):
    max_bytes = serializers.IntegerField(help_text="Largest archive (compressed) the console accepts")
    max_unpacked_bytes = serializers.IntegerField(help_text="Largest total of the archive's files, unpacked")


class BundleLimits(APIView):
    """What an upload may weigh, so a client can refuse a too-large bundle before sending it."""

    @extend_schema(request=None, responses={200: BundleLimitsSerializer})
    def get(self, request: Request) -> Response:
        limit: int = settings.BUNDLE_MAX_BYTES
        return Response({"max_bytes": limit, "max_unpacked_bytes": limit * UNPACKED_FACTOR})


class BundleDetail(VisibleBundles, RetrieveAPIView[Bundle]):
    serializer_class = BundleSerializer


class NodeAgent:
    """The identity of a caller that presented a node credential (an agent, not a person)."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    pk = None

    def __init__(self, identity: tokens.NodeIdentity) -> None:
        self.identity = identity
        self.username = f"node:{identity.node}" if identity.node else "node-agent"


class NodeTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <node credential>``; any other bearer falls through to user tokens."""

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        header = authentication.get_authorization_header(request).split()
        if len(header) != 2 or header[0].lower() != b"bearer":
            return None
        verdict = tokens.identify(header[1])
        if verdict.reason == "revoked":
            mark_auth(request._request, AuthMethod.NODE)
            raise exceptions.AuthenticationFailed("This node credential was revoked.")
        if verdict.identity is None:
            return None
        mark_auth(request._request, AuthMethod.NODE, verdict.identity.prefix)
        return NodeAgent(verdict.identity), None

    def authenticate_header(self, request: Request) -> str:
        # Makes an anonymous request a 401 with a challenge rather than a bare 403.
        return 'Bearer realm="api"'


class BundleArchive(VisibleBundles, RetrieveAPIView[Bundle]):
    authentication_classes = [NodeTokenAuthentication, TokenAuthentication, SessionAuthentication]
    serializer_class = BundleSerializer
    lookup_field = "sha256"

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:  # type: ignore[override]
        return self.retrieve(request, *args, **kwargs)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:  # type: ignore[override]
        bundle = self.get_object()
        caller = request.user
        if isinstance(caller, NodeAgent):
            if caller.identity.node is not None:
                runs_it = Allocation.objects.filter(
                    node__name=caller.identity.node, round__job__bundle=bundle
                )
                if not runs_it.exists():
                    raise exceptions.PermissionDenied("This node runs no job with this bundle.")
        elif not bundle.workspaces.filter(pk__in=access.editable_workspaces(caller)).exists():
            # Code holds what its authors put there (keys included): its metadata is every
            # viewer's to see, its content only for those who may run it.
            raise exceptions.PermissionDenied(
                "Only editors of a workspace this bundle belongs to may download its code."
            )
        path = bundle_path(bundle)
        if not path.is_file():
            raise Http404("The bundle's archive is missing from the console's storage.")
        response = FileResponse(
            open(path, "rb"),  # noqa: SIM115 - FileResponse closes it
            as_attachment=True,
            filename=bundle.filename or f"{bundle.sha256}.bundle",
            content_type="application/octet-stream",
        )
        response["X-Bundle-Sha256"] = bundle.sha256
        return response
