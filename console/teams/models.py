"""Workspaces and who belongs to them; node pools (label selectors) and each workspace's quota in a pool.

A job, a bundle and a token belong to a workspace. The ``default`` workspace (made by the first
migration, so that data from before workspaces keeps working) is open to ``everyone``: every
signed-in user is a member with the role their site role gives (operator: editor; else viewer).
Other workspaces hold their members only. Site admins (superusers) see and act on every one.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

DEFAULT_WORKSPACE = "default"


class Role(models.TextChoices):
    """A member's role in a workspace; each one may do what the ones below it may."""

    VIEWER = "viewer", "viewer"  # sees the workspace's jobs, events, metrics, logs
    EDITOR = "editor", "editor"  # also submits, resizes, restarts, stops; uploads bundles
    ADMIN = "admin", "workspace admin"  # also adds and removes members, changes their roles


# A role may do what every role of a lower level may.
ROLE_LEVEL = {Role.VIEWER.value: 1, Role.EDITOR.value: 2, Role.ADMIN.value: 3}


class Workspace(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=255, blank=True)
    # Fair share: among workspaces that borrow in a pool, each one's share of what is borrowed
    # is in proportion to its weight (console/teams/fairshare.py).
    weight = models.PositiveIntegerField(default=1)
    everyone = models.BooleanField(
        default=False, help_text="Every signed-in user is a member, with the role their site role gives"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(condition=Q(weight__gte=1), name="workspace_weight_positive")]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workspace", "user"]
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="membership_one_per_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"


class Resource(models.TextChoices):
    """What a pool's quotas count."""

    GPU = "gpu", "GPUs"
    CPU = "cpu", "CPU slots"


class NodePool(models.Model):
    """The nodes whose labels include every pair of ``selector`` ({} : every node)."""

    name = models.SlugField(max_length=64, unique=True)
    selector = models.JSONField(
        default=dict, blank=True, help_text='Labels a node must have, e.g. {"gpu": "a100"}'
    )
    resource = models.CharField(max_length=8, choices=Resource.choices, default=Resource.GPU)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def matches(self, labels: dict[str, Any]) -> bool:
        return all(str(labels.get(k)) == str(v) for k, v in self.selector.items())


class Quota(models.Model):
    """A workspace's nominal share of a pool (GPUs or CPU slots), and how much more it may
    borrow of what the pool's other workspaces leave idle (None: as much as is idle)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="quotas")
    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="quotas")
    nominal = models.PositiveIntegerField(default=0)
    borrowing_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this much over nominal; no limit when empty"
    )

    class Meta:
        ordering = ["pool", "workspace"]
        constraints = [models.UniqueConstraint(fields=["workspace", "pool"], name="quota_one_per_pool")]

    def __str__(self) -> str:
        return f"{self.workspace} in {self.pool}: {self.nominal}"


def default_workspace_id() -> int:
    """The default workspace (made by migration 0001, and on post_migrate: console/teams/apps.py)."""
    workspace, _ = Workspace.objects.get_or_create(name=DEFAULT_WORKSPACE, defaults={"everyone": True})
    return workspace.pk
