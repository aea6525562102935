from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from console.api.models import ApiToken
from console.api.views import revoke_token


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued by their users (API, CLI, the tokens page) since the raw value is shown
    only once; staff can see and revoke them here (each revoke is audited)."""

    list_display = ("name", "user", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = (
        "user",
        "name",
        "prefix",
        "key_hash",
        "scopes",
        "created_at",
        "expires_at",
        "last_used_at",
        "last_used_address",
        "revoked",
        "revoked_at",
    )
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = 0
        for token in queryset.select_related("user"):
            before = token.revoked
            revoke_token(request.user, token, how="admin")
            count += int(not before)
        self.message_user(request, f"{count} token(s) revoked", messages.SUCCESS)
