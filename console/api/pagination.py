"""Keyset (cursor) pagination for every list of the API.

DRF's CursorPagination keeps only the first ordering field in its cursor and steps over equal
values with an offset, so a list sorted by a field with repeats (a job name, a priority) gets
slower page by page. Here the cursor holds the whole sort key, always ending in the primary key,
and a page is "the next ``page_size`` rows after this key": as cheap on page 2,000 as on page 1
given an index on the sort key. The response shape is DRF's: ``{"next", "previous", "results"}``.

A view names its order with ``cursor_ordering`` (a tuple of field names, ``-`` for descending) or
``get_cursor_ordering(request)``; otherwise the model's Meta.ordering is used. Fields must be
non-null columns of the listed model.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Field, Model, Q, QuerySet
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class KeyCursor:
    """A position in a sorted list: the sort key of the row it follows (or precedes)."""

    key: tuple[Any, ...]
    backwards: bool


def _field_and_direction(term: str) -> tuple[str, bool]:
    return (term[1:], True) if term.startswith("-") else (term, False)


def complete_ordering(ordering: Sequence[str]) -> tuple[str, ...]:
    """The ordering with the primary key appended (same direction as the first field), so every
    row has a distinct key."""
    terms = tuple(ordering)
    if not terms:
        return ("-id",)
    if _field_and_direction(terms[-1])[0] in ("id", "pk"):
        return terms
    descending = _field_and_direction(terms[0])[1]
    return (*terms, "-id" if descending else "id")


def after_key(ordering: Sequence[str], key: Sequence[Any]) -> Q:
    """Rows strictly after ``key`` in ``ordering`` (lexicographic order of the fields).

    The first field's bound is repeated as a plain AND so that PostgreSQL uses it as an index
    condition and starts the scan at the key instead of filtering from the top."""
    alternatives = Q(pk__in=[])
    equal_so_far = Q()
    for term, value in zip(ordering, key, strict=True):
        field, descending = _field_and_direction(term)
        alternatives |= equal_so_far & Q(**{f"{field}__{'lt' if descending else 'gt'}": value})
        equal_so_far &= Q(**{field: value})
    first, descending = _field_and_direction(ordering[0])
    return Q(**{f"{first}__{'lte' if descending else 'gte'}": key[0]}) & alternatives


def encode_cursor(sort: Sequence[str], key: Sequence[Any], backwards: bool = False) -> str:
    """The ``cursor`` value for the rows after (or before) ``key`` in ``sort`` order."""
    payload = {"k": list(key), "b": backwards, "s": list(sort)}
    return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")


def _concrete(field: Any) -> Field[Any, Any]:
    """A column of the listed model (sort keys are never reverse relations)."""
    if not isinstance(field, Field):
        raise ValueError(f"{field} is not a column")
    return field


def _reverse(ordering: Sequence[str]) -> tuple[str, ...]:
    return tuple(term[1:] if term.startswith("-") else f"-{term}" for term in ordering)


def key_of(sort: Sequence[str], row: Model) -> list[Any]:
    """The row's sort key as JSON values (times in ISO 8601)."""
    values = []
    for term in sort:
        field = _field_and_direction(term)[0]
        value = (
            row.pk if field in ("id", "pk") else getattr(row, _concrete(row._meta.get_field(field)).attname)
        )
        values.append(value.isoformat() if hasattr(value, "isoformat") else value)
    return values


def decode_cursor(raw: str, sort: Sequence[str], model: type[Model]) -> KeyCursor:
    """The position a ``cursor`` value names; ValueError when it is malformed or was made for
    another sort order."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(raw.encode() + b"==").decode())
        key, backwards, its_sort = decoded["k"], bool(decoded["b"]), tuple(decoded["s"])
        if its_sort != tuple(sort) or not isinstance(key, list) or len(key) != len(sort):
            raise ValueError("the cursor belongs to another sort order")
        values = tuple(
            model._meta.pk.to_python(v)
            if (name := _field_and_direction(term)[0]) in ("id", "pk")
            else _concrete(model._meta.get_field(name)).to_python(v)
            for term, v in zip(sort, key, strict=True)
        )
    except Exception as exc:  # any malformed part (base64, JSON, a value of the wrong type)
        raise ValueError("invalid cursor") from exc
    return KeyCursor(values, backwards)


def keyset_page(
    queryset: QuerySet[Any], sort: Sequence[str], cursor: KeyCursor | None, page_size: int
) -> tuple[list[Any], bool, bool]:
    """One page of ``queryset`` in ``sort`` order (complete: ending in the primary key) after or
    before ``cursor``, in one query: (rows, has_next, has_previous)."""
    order = _reverse(sort) if cursor and cursor.backwards else tuple(sort)
    rows = queryset.order_by(*order)
    if cursor is not None:
        rows = rows.filter(after_key(order, cursor.key))
    page = list(rows[: page_size + 1])
    more = len(page) > page_size
    page = page[:page_size]
    if cursor is not None and cursor.backwards:
        page.reverse()
        return page, True, more
    return page, more, cursor is not None


class KeysetPagination(CursorPagination):
    """``?cursor=`` from a previous page's ``next``/``previous``; ``?page_size=`` up to 500."""

    page_size = DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    ordering = "-id"
    invalid_cursor_message = "Invalid cursor: use the next or previous link of an earlier page."

    # Keyset pages need a queryset (DRF's signature also allows a list).
    def paginate_queryset(  # type: ignore[override]
        self, queryset: QuerySet[Any], request: Request, view: Any = None
    ) -> list[Any] | None:
        self.request = request
        self.base_url = request.build_absolute_uri()
        self.page_size = self.get_page_size(request)
        self.sort = complete_ordering(self.cursor_ordering(request, view, queryset))
        cursor = self.read_cursor(request, queryset.model)
        self.page, self.has_next, self.has_previous = keyset_page(queryset, self.sort, cursor, self.page_size)
        return self.page

    def cursor_ordering(self, request: Request, view: Any, queryset: QuerySet[Any]) -> Sequence[str]:
        """The view's order, else the model's default order, else newest first."""
        if view is not None and hasattr(view, "get_cursor_ordering"):
            return tuple(view.get_cursor_ordering(request))
        if view is not None and getattr(view, "cursor_ordering", None):
            return tuple(view.cursor_ordering)
        model_order = queryset.model._meta.ordering
        if model_order and all(isinstance(term, str) for term in model_order):
            return tuple(model_order)
        return (self.ordering,) if isinstance(self.ordering, str) else tuple(self.ordering)

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise serializers.ValidationError(
                {self.page_size_query_param: [f"Give a whole number from 1 to {self.max_page_size}."]}
            )
        return int(raw)

    # --- cursor encoding ---------------------------------------------------------------------

    def read_cursor(self, request: Request, model: type[Model]) -> KeyCursor | None:
        raw = request.query_params.get(self.cursor_query_param)
        if not raw:
            return None
        try:
            return decode_cursor(raw, self.sort, model)
        except ValueError:
            raise serializers.ValidationError(
                {self.cursor_query_param: [self.invalid_cursor_message]}
            ) from None

    def _link(self, row: Model, backwards: bool) -> str:
        token = encode_cursor(self.sort, key_of(self.sort, row), backwards)
        return replace_query_param(self.base_url or "", self.cursor_query_param, token)

    def get_next_link(self) -> str | None:  # type: ignore[override]
        if not self.has_next or not self.page:
            return None
        return self._link(self.page[-1], backwards=False)

    def get_previous_link(self) -> str | None:  # type: ignore[override]
        if not self.has_previous or not self.page:
            return None
        return self._link(self.page[0], backwards=True)

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data})

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "The cursor from a previous page's next or previous link.",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Results per page (default {self.page_size}, at most {self.max_page_size}).",
                "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size},
            },
        ]
