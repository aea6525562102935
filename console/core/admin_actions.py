"""The admin's site-wide "delete selected" action, audited object by object.

Django logs a bulk deletion of several objects with one bulk insert into its LogEntry table,
which sends no signal; this wrapper records each deleted object in the audit log instead."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.actions import delete_selected
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from console.core.audit import AuthMethod
from console.core.models import AuditEntry
from console.core.receivers import bulk_admin_delete


def audited_delete_selected(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    targets = [(str(obj.pk), str(obj)[:200]) for obj in queryset]
    model_name = queryset.model._meta.model_name or ""
    token = bulk_admin_delete.set(True)
    try:
        response = delete_selected(modeladmin, request, queryset)
    finally:
        bulk_admin_delete.reset(token)
    if response is None:  # confirmed and done (otherwise Django showed the confirmation page)
        for pk, text in targets:
            AuditEntry.record_raw(
                request.user,
                "admin.delete",
                target_type=model_name,
                target_id=pk,
                via=AuthMethod.SESSION,
                object=text,
            )
    return response


audited_delete_selected.short_description = delete_selected.short_description  # type: ignore[attr-defined]
audited_delete_selected.allowed_permissions = ("delete",)  # type: ignore[attr-defined]


def install() -> None:
    admin.site.add_action(audited_delete_selected, "delete_selected")
