"""Jobs and workspaces: which jobs a caller may see and change, where a new job goes (its
workspace and node pool). The jobs API, pages and streams ask here (console/teams/access.py says
who has which role)."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework import permissions, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request

from console.jobs.models import Job
from console.teams import access
from console.teams.models import NodePool, Role, Workspace


class IsOperatorOrReadOnly(permissions.BasePermission):
    """Reads for every signed-in user (of the workspaces they see); changes for editors of some
    workspace (site operators are editors of the default one). Each job is checked again."""

    message = "Only editors of a workspace (or members of the 'operator' group) may change jobs."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return access.acts_anywhere(request.user)


def visible_job(user: Any, job_id: Any, role: Role = Role.VIEWER) -> Job:
    """The job ``job_id`` if ``user`` may see it (404 otherwise, as if it did not exist) and has
    ``role`` or above in its workspace (403 otherwise)."""
    if not str(job_id).isdigit():
        raise Http404("No such job.")
    job = access.visible(user, Job.objects.all()).filter(pk=int(job_id)).first()
    if job is None:
        raise Http404("No such job.")
    if not access.may(user, job.workspace_id, role):
        raise PermissionDenied(
            f"Your role in this job's workspace does not allow this ({role.label} needed)."
        )
    return job


def submit_workspace(user: Any, name: str) -> Workspace:
    """The workspace a job is submitted to: the one named, if the user is an editor there; else
    the default one if they are, else their only one. A workspace they may not see is reported
    as unknown."""
    editable = set(access.editable_workspaces(user))
    if name:
        workspace = Workspace.objects.filter(name=name).first()
        if workspace is None or workspace.pk not in access.roles(user):
            raise serializers.ValidationError({"workspace": [f"No workspace {name!r}."]})
        if workspace.pk not in editable:
            raise PermissionDenied(f"You may not submit jobs to workspace {name!r} (editor needed).")
        return workspace
    default = Workspace.objects.filter(everyone=True, pk__in=editable).order_by("name").first()
    if default is not None:
        return default
    if len(editable) == 1:
        return Workspace.objects.get(pk=next(iter(editable)))
    raise serializers.ValidationError({"workspace": ["Name the workspace to submit to."]})


def submit_pool(name: str, workspace: Workspace, gpus: bool) -> NodePool | None:
    """The pool named; else the first pool of the job's kind (GPU or CPU) where its workspace has
    a quota; else none (no quota applies, any node will do)."""
    if name:
        pool = NodePool.objects.filter(name=name).first()
        if pool is None:
            raise serializers.ValidationError({"pool": [f"No node pool {name!r}."]})
        return pool
    kind = "gpu" if gpus else "cpu"
    return NodePool.objects.filter(resource=kind, quotas__workspace=workspace).order_by("name").first()
