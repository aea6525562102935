"""Filters of the audit log, shared by the staff page and ``/api/v1/audit/``."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import QuerySet

from console.api.filters import UtcDateTimeFilter
from console.core.audit import AuthMethod
from console.core.models import AuditEntry

AUTH_METHODS = [
    (m, m)
    for m in (AuthMethod.SESSION, AuthMethod.PASSWORD, AuthMethod.TOKEN, AuthMethod.NODE, AuthMethod.SYSTEM)
]


class AddressFilter(django_filters.Filter):
    """An IP address, checked before it reaches the inet column (where a bad one is a DB error)."""

    field_class = forms.GenericIPAddressField


class AuditFilter(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name", help_text="Account name (exact)")
    action = django_filters.CharFilter(
        method="action_prefix", help_text="Action, or its start: 'auth.' is every sign-in event"
    )
    target_type = django_filters.CharFilter(help_text="e.g. job, node, apitoken, bundle, user")
    target_id = django_filters.CharFilter()
    address = AddressFilter(field_name="source_address", help_text="Source address (exact)")
    auth_method = django_filters.ChoiceFilter(choices=AUTH_METHODS)
    since = UtcDateTimeFilter(field_name="at", lookup_expr="gte", help_text="ISO 8601, inclusive")
    until = UtcDateTimeFilter(field_name="at", lookup_expr="lt", help_text="ISO 8601, exclusive")

    class Meta:
        model = AuditEntry
        fields: list[str] = []

    def action_prefix(self, queryset: QuerySet[AuditEntry], name: str, value: str) -> QuerySet[AuditEntry]:
        return (
            queryset.filter(action__startswith=value)
            if value.endswith(".")
            else queryset.filter(action=value)
        )
