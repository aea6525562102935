"""Personal API tokens (list, create, revoke, "the token I am using"), the password-for-token
exchange that ``trainyard login`` uses, and the audit log for staff."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import authenticate
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api import lockout
from console.api.audit_filters import AuditFilter
from console.api.models import ALL_SCOPES, ApiToken, Scope
from console.core.audit import AuthMethod
from console.core.models import AuditEntry

MAX_EXPIRY_DAYS = 3650


class TokenSerializer(serializers.ModelSerializer):
    name = serializers.RegexField(
        r"^[\w.\- ]{1,64}$",
        max_length=64,
        error_messages={"invalid": "Use 1-64 letters, digits, spaces, '.', '-' or '_'."},
    )
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ALL_SCOPES), read_only=True, help_text="What the token may do."
    )
    expired = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "scopes",
            "created_at",
            "expires_at",
            "expired",
            "last_used_at",
            "last_used_address",
            "revoked",
            "revoked_at",
        ]
        read_only_fields = [f for f in fields if f != "name"]


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret: shown this once, never again.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


def token_name_field() -> serializers.RegexField:
    """The name a person gives a token (an API token, a node join token)."""
    return serializers.RegexField(
        r"^[\w.\- ]{1,64}$",
        max_length=64,
        error_messages={"invalid": "Use 1-64 letters, digits, spaces, '.', '-' or '_'."},
    )


class TokenRequestSerializer(serializers.Serializer):
    name = token_name_field()
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ALL_SCOPES),
        required=False,
        allow_empty=False,
        max_length=len(ALL_SCOPES),
        help_text="Default: read only.",
    )
    expires_in_days = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_EXPIRY_DAYS, help_text="Default: never."
    )
    replace = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Revoke the caller's live token of the same name first (else a name in use is a 409).",
    )

    def expiry(self) -> Any:
        days = self.validated_data.get("expires_in_days")
        return timezone.now() + timedelta(days=days) if days else None


class PasswordLoginSerializer(TokenRequestSerializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, style={"input_type": "password"})
    replace = serializers.BooleanField(
        required=False, default=True, help_text="Revoke the user's live token of the same name first."
    )


def issue_token(request: Request, user: Any, body: TokenRequestSerializer) -> Response:
    """Issue (or, with replace, swap) a token; the audit log records it."""
    data = body.validated_data
    scopes = data.get("scopes") or [Scope.READ.value]
    caller = request.auth if isinstance(request.auth, ApiToken) else None
    if caller is not None and not all(caller.allows(scope) for scope in scopes):
        raise exceptions.PermissionDenied("A token cannot create a token with scopes it does not have.")
    if not data["replace"] and ApiToken.objects.filter(user=user, name=data["name"], revoked=False).exists():
        raise exceptions.ValidationError(
            {"name": [f"You already have a token named {data['name']!r}; revoke it or ask to replace it."]}
        )
    token, raw = ApiToken.issue(user, data["name"], scopes, body.expiry(), replace=data["replace"])
    AuditEntry.record(
        user, "token.create", token, name=token.name, scopes=token.scopes, replace=data["replace"]
    )
    out = dict(TokenSerializer(token).data)
    out["token"] = raw
    return Response(out, status=status.HTTP_201_CREATED)


def revoke_token(actor: Any, token: ApiToken, how: str) -> None:
    if token.revoke():
        AuditEntry.record(
            actor, "token.revoke", token, name=token.name, owner=token.user.get_username(), how=how
        )


class TokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """The caller's own tokens. With a token, managing tokens needs the ``admin`` scope, except
    revoking the token in use (``DELETE current/``, what ``trainyard logout`` does)."""

    serializer_class = TokenSerializer
    cursor_ordering = ("-created_at", "-id")
    write_scope = Scope.ADMIN

    def required_scope_for(self, request: Request) -> str | None:
        if self.action == "current":
            return None
        return Scope.READ if request.method in permissions.SAFE_METHODS else Scope.ADMIN

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user_id=int(self.request.user.pk or 0), revoked=False)

    @extend_schema(request=TokenRequestSerializer, responses={201: NewTokenSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return issue_token(request, request.user, body)

    def perform_destroy(self, instance: ApiToken) -> None:
        revoke_token(self.request.user, instance, how="api")

    @extend_schema(methods=["GET"], request=None, responses={200: TokenSerializer})
    @extend_schema(methods=["DELETE"], request=None, responses={204: None})
    @action(detail=False, methods=["get", "delete"], pagination_class=None)
    def current(self, request: Request) -> Response:
        """The token this request was made with; DELETE revokes it (sign out)."""
        token = request.auth
        if not isinstance(token, ApiToken):
            raise Http404("This request was not made with an API token.")
        if request.method == "DELETE":
            revoke_token(request.user, token, how="logout")
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(TokenSerializer(token).data)


class PasswordTokenView(APIView):
    """Username and password for a personal token (``trainyard login``). By default a live token
    of the same name is replaced, so logging in again does not pile tokens up. Failed attempts
    count towards the lockout like the login form's."""

    authentication_classes: list[Any] = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=PasswordLoginSerializer, responses={201: NewTokenSerializer}, auth=[])
    def post(self, request: Request) -> Response:
        body = PasswordLoginSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        raw_request = request._request
        user = authenticate(
            raw_request, username=body.validated_data["username"], password=body.validated_data["password"]
        )
        if getattr(raw_request, "axes_locked_out", False):
            wait = lockout.retry_after_seconds(raw_request)
            raise exceptions.Throttled(wait=wait, detail="Too many failed sign-in attempts.")
        if user is None or not user.is_active:
            raise exceptions.AuthenticationFailed("Wrong username or password.")
        # No session is made, so Django's user_logged_in (which audits the form) does not fire.
        AuditEntry.record(user, "auth.login", user, via=AuthMethod.PASSWORD, place="api")
        return issue_token(request, user, body)

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class IsStaff(permissions.BasePermission):
    message = "The audit log is for staff."

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="The account's name at the time")

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "target_type",
            "target_id",
            "source_address",
            "auth_method",
            "token_prefix",
            "data",
        ]
        read_only_fields = fields


class AuditList(ListAPIView[AuditEntry]):
    """The audit log, newest first (staff; a token needs the ``admin`` scope)."""

    serializer_class = AuditEntrySerializer
    permission_classes = [IsStaff]
    filterset_class = AuditFilter
    cursor_ordering = ("-at", "-id")
    queryset = AuditEntry.objects.all()

    def required_scope_for(self, request: Request) -> str:
        return Scope.ADMIN
