from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


class AuditEntry(models.Model):
    """Who did what to which object, for every operator and admin action."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        who = self.actor.get_username() if self.actor else "system"
        return f"{who} {self.action} {self.target_type}:{self.target_id}"

    @classmethod
    def record(cls, actor: Any, action: str, target: models.Model, **data: Any) -> AuditEntry:
        user = actor if getattr(actor, "is_authenticated", False) else None
        return cls.objects.create(
            actor=user,
            action=action,
            target_type=target._meta.model_name or "",
            target_id=str(target.pk),
            data=data,
        )
