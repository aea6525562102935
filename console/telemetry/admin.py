from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from console.jobs.admin import JobAdmin, ReadOnlyInline
from console.telemetry.models import Event


class EventInline(ReadOnlyInline):
    model = Event
    fields = ("created_at", "severity", "kind", "round_number", "node", "message")
    readonly_fields = fields
    ordering = ("-id",)
    show_change_link = False

    def get_queryset(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        # A long job has thousands of events; the admin page shows the latest ones only.
        qs = super().get_queryset(request).select_related("node")
        ids = list(qs.values_list("id", flat=True)[:50])
        return qs.filter(id__in=ids)


# The job's admin page lists its latest events (jobs does not import telemetry: see
# tests/test_app_imports.py).
JobAdmin.inlines = [*JobAdmin.inlines, EventInline]


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
