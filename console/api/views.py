"""Personal API tokens: list, create (the raw token is shown once), revoke."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.models import ApiToken


class TokenSerializer(serializers.ModelSerializer):
    name = serializers.RegexField(r"^[\w.\- ]{1,64}$", max_length=64)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked"]


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True)

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class TokenViewSet(
    mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    serializer_class = TokenSerializer

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user_id=int(self.request.user.pk or 0), revoked=False)

    @extend_schema(request=TokenSerializer, responses={201: NewTokenSerializer})
    def create(self, request: Request) -> Response:
        body = TokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token, raw = ApiToken.issue(request.user, body.validated_data["name"])
        data = dict(TokenSerializer(token).data)
        data["token"] = raw
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiToken) -> None:
        instance.revoked = True
        instance.save(update_fields=["revoked"])
