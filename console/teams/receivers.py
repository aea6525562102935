"""Audit of membership and quota changes, whichever way they are made (admin, API, shell)."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from console.core.audit import _current_request
from console.core.models import AuditEntry
from console.teams.models import Membership, Quota


def _actor() -> Any:
    request = _current_request.get()
    return getattr(request, "user", None) if request is not None else None


@receiver(pre_save, sender=Membership, dispatch_uid="teams_membership_before")
def _remember_role(sender: Any, instance: Membership, **kwargs: Any) -> None:
    old = (
        Membership.objects.filter(pk=instance.pk).values_list("role", flat=True).first()
        if instance.pk
        else None
    )
    instance._old_role = old  # type: ignore[attr-defined]


@receiver(post_save, sender=Membership, dispatch_uid="teams_membership_saved")
def _audit_membership(sender: Any, instance: Membership, created: bool, **kwargs: Any) -> None:
    old = getattr(instance, "_old_role", None)
    if not created and old == instance.role:
        return
    action = "workspace.member_added" if created else "workspace.member_role_changed"
    data: dict[str, Any] = {"workspace": instance.workspace.name, "user": instance.user.get_username()}
    data["role"] = instance.role
    if old is not None:
        data["previous_role"] = old
    AuditEntry.record(_actor(), action, instance.workspace, **data)


@receiver(post_delete, sender=Membership, dispatch_uid="teams_membership_deleted")
def _audit_removal(sender: Any, instance: Membership, **kwargs: Any) -> None:
    AuditEntry.record_raw(
        _actor(),
        "workspace.member_removed",
        target_type="workspace",
        target_id=str(instance.workspace_id),
        user=instance.user.get_username(),
        role=instance.role,
    )


@receiver(post_save, sender=Quota, dispatch_uid="teams_quota_saved")
def _audit_quota(sender: Any, instance: Quota, created: bool, **kwargs: Any) -> None:
    AuditEntry.record(
        _actor(),
        "quota.set",
        instance.workspace,
        pool=instance.pool.name,
        nominal=instance.nominal,
        borrowing_limit=instance.borrowing_limit,
    )
