"""Personal API tokens: named, optionally expiring, scoped; only a hash of the secret is stored."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

TOKEN_PREFIX = "ty_"
PREFIX_LENGTH = 10


class Scope(StrEnum):
    """What a token may do, on top of what its user's role allows."""

    READ = "read"  # every GET: jobs, nodes, metrics, logs, bundles, its user's tokens
    JOBS_WRITE = "jobs:write"  # submit, resize, restart, stop; upload bundles
    NODES_WRITE = "nodes:write"  # drain and undrain nodes
    ADMIN = "admin"  # every scope, plus staff reads (audit log) and managing tokens with a token


ALL_SCOPES = [s.value for s in Scope]


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def default_scopes() -> list[str]:
    return [Scope.READ.value]


class ApiToken(models.Model):
    """A personal API token. Only its hash is stored; the raw value is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, db_index=True)
    scopes = models.JSONField(default=default_scopes)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Never expires when empty")
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_address = models.GenericIPAddressField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One live token per name and user: the CLI's "replace my token" relies on it.
            models.UniqueConstraint(
                fields=["user", "name"], condition=models.Q(revoked=False), name="apitoken_live_name_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def usable(self) -> bool:
        return not self.revoked and not self.expired

    def allows(self, scope: str) -> bool:
        """``admin`` implies every scope."""
        return scope in self.scopes or Scope.ADMIN.value in self.scopes

    def revoke(self) -> bool:
        """Revoke once; True when this call revoked it."""
        now = timezone.now()
        changed = ApiToken.objects.filter(pk=self.pk, revoked=False).update(revoked=True, revoked_at=now)
        if changed:
            self.revoked, self.revoked_at = True, now
        return bool(changed)

    def note_use(self, address: str | None) -> None:
        """Record the use, at most once per TOKEN_LAST_USED_RESOLUTION_SECONDS: a write per request
        would cost more than most requests."""
        now = timezone.now()
        resolution = timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION_SECONDS)
        if self.last_used_at is not None and now - self.last_used_at < resolution:
            return
        # Conditional, so concurrent requests write once between them.
        stale = models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=now - resolution)
        ApiToken.objects.filter(stale, pk=self.pk).update(last_used_at=now, last_used_address=address or None)
        self.last_used_at = now

    @classmethod
    def issue(
        cls,
        user: Any,
        name: str,
        scopes: list[str] | None = None,
        expires_at: datetime | None = None,
        replace: bool = False,
    ) -> tuple[ApiToken, str]:
        """A new token and its raw value. With ``replace``, a live token of the same name is revoked
        first (how the CLI swaps its own token on a new login instead of piling them up)."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with transaction.atomic():
            if replace:
                for old in cls.objects.select_for_update().filter(user=user, name=name, revoked=False):
                    old.revoke()
            token = cls.objects.create(
                user=user,
                name=name,
                key_hash=hash_token(raw),
                prefix=raw[:PREFIX_LENGTH],
                scopes=sorted(set(scopes)) if scopes is not None else default_scopes(),
                expires_at=expires_at,
            )
        return token, raw
