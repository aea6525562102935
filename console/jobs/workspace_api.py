"""Workspaces and quotas over the API: ``GET /api/v1/workspaces/`` (those the caller sees, with
their role; members for its admins), ``POST /api/v1/workspaces/{name}/members/`` ({"user",
"role"}: add or change a member) and ``DELETE /api/v1/workspaces/{name}/members/{user}/``
(workspace admins and site admins; audited by console/teams/receivers.py), and ``GET
/api/v1/quotas/`` (each pool's use, quota and borrowing by workspace)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.models import Scope
from console.jobs.quotas import quota_rows
from console.teams import access
from console.teams.models import ROLE_LEVEL, Membership, Role, Workspace


class MemberSerializer(serializers.Serializer):
    user = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.VIEWER)


class WorkspaceSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    weight = serializers.IntegerField()
    everyone = serializers.BooleanField(help_text="Every signed-in user is a member")
    role = serializers.CharField(help_text="Your role in it")
    members = MemberSerializer(many=True, required=False, help_text="Its workspace admins see these")


class QuotaRowSerializer(serializers.Serializer):
    pool = serializers.CharField()
    unit = serializers.CharField()
    capacity = serializers.IntegerField()
    workspace = serializers.CharField()
    weight = serializers.IntegerField()
    nominal = serializers.IntegerField()
    borrowing_limit = serializers.IntegerField(allow_null=True)
    used = serializers.IntegerField()
    borrowed = serializers.IntegerField()
    pending = serializers.IntegerField()
    mine = serializers.BooleanField()


def _admin_of(user: Any, name: str) -> Workspace:
    """The workspace ``name`` if the caller may manage its members (404: not one they see)."""
    workspace = Workspace.objects.filter(name=name).first()
    if workspace is None or workspace.pk not in access.roles(user):
        raise Http404("No such workspace.")
    if not access.may(user, workspace.pk, Role.ADMIN):
        raise PermissionDenied("Only the workspace's admins may change its members.")
    return workspace


class WorkspaceList(APIView):
    @extend_schema(request=None, responses={200: WorkspaceSerializer(many=True)})
    def get(self, request: Request) -> Response:
        roles = access.roles(request.user)
        rows = []
        for workspace in Workspace.objects.filter(pk__in=list(roles)).order_by("name"):
            row: dict[str, Any] = {
                "name": workspace.name,
                "description": workspace.description,
                "weight": workspace.weight,
                "everyone": workspace.everyone,
                "role": roles[workspace.pk],
            }
            if ROLE_LEVEL[roles[workspace.pk]] >= ROLE_LEVEL[Role.ADMIN.value]:
                members = workspace.memberships.select_related("user").order_by("user__username")
                row["members"] = [{"user": m.user.get_username(), "role": m.role} for m in members]
            rows.append(row)
        return Response(WorkspaceSerializer(rows, many=True).data)


class WorkspaceMembers(APIView):
    write_scope = Scope.ADMIN

    @extend_schema(request=MemberSerializer, responses={200: MemberSerializer, 201: MemberSerializer})
    def post(self, request: Request, name: str) -> Response:
        workspace = _admin_of(request.user, name)
        body = MemberSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = get_user_model().objects.filter(username=body.validated_data["user"]).first()
        if user is None:
            raise serializers.ValidationError({"user": [f"No user {body.validated_data['user']!r}."]})
        with transaction.atomic():
            member, created = Membership.objects.get_or_create(
                workspace=workspace, user=user, defaults={"role": body.validated_data["role"]}
            )
            if not created and member.role != body.validated_data["role"]:
                member.role = body.validated_data["role"]
                member.save(update_fields=["role"])
        return Response(
            {"user": user.get_username(), "role": member.role},
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class WorkspaceMember(APIView):
    write_scope = Scope.ADMIN

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, name: str, username: str) -> Response:
        workspace = _admin_of(request.user, name)
        member = Membership.objects.filter(workspace=workspace, user__username=username).first()
        if member is None:
            raise Http404("No such member.")
        member.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class QuotaList(APIView):
    @extend_schema(request=None, responses={200: QuotaRowSerializer(many=True)})
    def get(self, request: Request) -> Response:
        rows = [row.__dict__ for row in quota_rows(request.user)]
        return Response(QuotaRowSerializer(rows, many=True).data)
