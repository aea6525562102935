from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from console.core.audit import current_origin


class AuditEntry(models.Model):
    """Who did what to which object, when, from which address and signed in how.

    Every change a person makes is recorded: sign-ins (and failed ones), token create/revoke,
    bundle uploads, job and node actions, admin edits."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # The name at the time: kept when the account is deleted, and for failed sign-ins with no account.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64)
    source_address = models.GenericIPAddressField(null=True, blank=True)
    auth_method = models.CharField(max_length=16, blank=True)
    token_prefix = models.CharField(max_length=12, blank=True, help_text="The API token used, if any")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["-at", "-id"], name="audit_recent"),
            models.Index(fields=["actor", "-at"], name="audit_by_actor"),
            models.Index(fields=["action", "-at"], name="audit_by_action"),
            models.Index(fields=["target_type", "target_id"], name="audit_by_target"),
        ]

    def __str__(self) -> str:
        who = self.actor_name or (self.actor.get_username() if self.actor else "system")
        return f"{who} {self.action} {self.target_type}:{self.target_id}"

    @classmethod
    def record(cls, actor: Any, action: str, target: models.Model | None, **data: Any) -> AuditEntry:
        """Record ``action`` by ``actor`` on ``target``; the request's origin is filled in."""
        return cls.record_raw(
            actor,
            action,
            target_type=(target._meta.model_name or "") if target is not None else "",
            target_id=str(target.pk) if target is not None else "",
            **data,
        )

    @classmethod
    def record_raw(
        cls,
        actor: Any,
        action: str,
        *,
        target_type: str,
        target_id: str,
        actor_name: str = "",
        via: str = "",
        **data: Any,
    ) -> AuditEntry:
        user = actor if getattr(actor, "is_authenticated", False) and getattr(actor, "pk", None) else None
        origin = current_origin()
        return cls.objects.create(
            actor=user,
            actor_name=actor_name or (user.get_username() if user is not None else ""),
            action=action,
            target_type=target_type[:32],
            target_id=target_id[:64],
            source_address=origin.address or None,
            auth_method=via or origin.auth_method,
            token_prefix=origin.token,
            data=data,
        )
