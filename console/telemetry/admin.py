from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from console.telemetry.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Events are what happened; they are browsed, never edited."""

    list_display = ("id", "created_at", "severity", "kind", "job", "node", "round_number", "message")
    list_filter = ("severity", "kind")
    search_fields = ("message", "kind", "job__name", "node__name")
    list_select_related = ("job", "node")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
