"""Who may see and act on what in which workspace: the one place the API, the pages, the
websockets and the CLI ask.

A site admin (superuser) sees and acts on every workspace. Anyone else has the role of their
membership in a workspace; in a workspace open to ``everyone`` (the default one), a signed-in
user without a membership has the role their site role gives (site operator: editor; else
viewer). Objects of a workspace one cannot see do not exist for one: 404, never 403, so that
their ids and names do not leak.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet

from console.core.roles import is_operator
from console.teams.models import ROLE_LEVEL, Membership, Role, Workspace

M = TypeVar("M", bound=Model)


def is_site_admin(user: Any) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_superuser)


def roles(user: Any) -> dict[int, str]:
    """Workspace id -> the user's role there, for every workspace the user may see (site admins:
    admin everywhere)."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return {}
    if user.is_superuser:
        return {pk: Role.ADMIN.value for pk in Workspace.objects.values_list("pk", flat=True)}
    found: dict[int, str] = {}
    open_role = Role.EDITOR.value if is_operator(user) else Role.VIEWER.value
    for pk in Workspace.objects.filter(everyone=True).values_list("pk", flat=True):
        found[pk] = open_role
    for pk, role in Membership.objects.filter(user=user).values_list("workspace_id", "role"):
        if ROLE_LEVEL[role] > ROLE_LEVEL.get(found.get(pk, ""), 0):
            found[pk] = role
    return found


def role_in(user: Any, workspace_id: int | None) -> str | None:
    if workspace_id is None:
        return None
    return roles(user).get(workspace_id)


def may(user: Any, workspace_id: int | None, role: Role) -> bool:
    """The user's role in the workspace is ``role`` or above."""
    held = role_in(user, workspace_id)
    return held is not None and ROLE_LEVEL[held] >= ROLE_LEVEL[role.value]


def visible(user: Any, queryset: QuerySet[M], field: str = "workspace") -> QuerySet[M]:
    """``queryset`` less the rows of workspaces the user may not see (``field``: the path to
    the workspace, e.g. "job__workspace")."""
    if is_site_admin(user):
        return queryset
    return queryset.filter(Q(**{f"{field}__in": list(roles(user))}))


def editable_workspaces(user: Any) -> list[int]:
    """Workspaces where the user may submit and change jobs."""
    return [pk for pk, role in roles(user).items() if ROLE_LEVEL[role] >= ROLE_LEVEL[Role.EDITOR.value]]


def acts_anywhere(user: Any) -> bool:
    """May change something in some workspace (the API's first gate; each object is checked too)."""
    return bool(editable_workspaces(user))
