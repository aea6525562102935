"""Filter fields shared by the API's lists."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, converted to UTC here: PostgreSQL refuses offsets past +-15:59 and
    Python cannot shift year 1 or 9999 across midnight; both were 500s before."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("Give a time between years 1 and 9999.", code="invalid") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField
