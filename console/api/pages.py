"""Pages for API access: the signed-in user's API tokens (under the user menu) and, for staff,
the audit log. Tokens are created and revoked here with plain form posts; the new token's secret
is shown on the answer page once and never again."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from rest_framework import serializers
from rest_framework.request import Request

from console.api.audit_filters import AUTH_METHODS, AuditFilter
from console.api.models import ALL_SCOPES, ApiToken, Scope
from console.api.pagination import KeysetPagination
from console.api.views import MAX_EXPIRY_DAYS, revoke_token
from console.core.models import AuditEntry

SCOPE_HELP = {
    Scope.READ: "read jobs, nodes, metrics, logs",
    Scope.JOBS_WRITE: "submit, resize, restart, stop; upload bundles",
    Scope.NODES_WRITE: "drain and undrain nodes",
    Scope.ADMIN: "audit log; manage tokens with this token",
}
AUDIT_PAGE_SIZE = 50


class NewTokenForm(forms.Form):
    name = forms.RegexField(
        regex=r"^[\w.\- ]{1,64}$",
        max_length=64,
        error_messages={"invalid": "Use 1-64 letters, digits, spaces, '.', '-' or '_'."},
    )
    scopes = forms.MultipleChoiceField(
        choices=[(s, f"{s}: {SCOPE_HELP[Scope(s)]}") for s in ALL_SCOPES],
        widget=forms.CheckboxSelectMultiple,
        initial=[Scope.READ.value],
    )
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_EXPIRY_DAYS, help_text="Empty: never expires"
    )


@login_required
@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    form = NewTokenForm()
    created: dict[str, Any] | None = None
    if request.method == "POST" and request.POST.get("action") == "revoke":
        chosen = request.POST.get("token", "")
        token = get_object_or_404(
            ApiToken, pk=int(chosen) if chosen.isdigit() else 0, user_id=int(request.user.pk or 0)
        )
        revoke_token(request.user, token, how="page")
    elif request.method == "POST":
        form = NewTokenForm(request.POST)
        if form.is_valid():
            created = _create(request, form)
            if created.get("error"):
                form.add_error("name", created.pop("error"))
                created = None
            else:
                form = NewTokenForm()
    tokens = ApiToken.objects.filter(user_id=int(request.user.pk or 0), revoked=False).order_by("-created_at")
    return render(
        request,
        "api/tokens.html",
        {"tokens": tokens, "form": form, "created": created, "nav": "tokens"},
        status=400 if request.method == "POST" and form.errors else 200,
    )


def _create(request: HttpRequest, form: NewTokenForm) -> dict[str, Any]:
    name = form.cleaned_data["name"]
    if ApiToken.objects.filter(user_id=int(request.user.pk or 0), name=name, revoked=False).exists():
        return {"error": f"You already have a token named {name!r}: revoke it first or pick another name."}
    days = form.cleaned_data.get("expires_in_days")
    expires = timezone.now() + timedelta(days=days) if days else None
    token, raw = ApiToken.issue(request.user, name, form.cleaned_data["scopes"], expires)
    AuditEntry.record(
        request.user, "token.create", token, name=token.name, scopes=token.scopes, replace=False
    )
    return {"token": token, "raw": raw}


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    """The audit log for staff, read-only, with the same filters as /api/v1/audit/."""
    if not request.user.is_staff:
        raise PermissionDenied("The audit log is for staff.")
    entries = AuditFilter(request.GET, queryset=AuditEntry.objects.select_related("actor"))
    page: list[AuditEntry] = []
    paginator = KeysetPagination()
    paginator.page_size = AUDIT_PAGE_SIZE
    error = ""
    if entries.is_valid():
        wrapped = Request(request)
        try:
            page = paginator.paginate_queryset(entries.qs, wrapped, view=_AuditOrder()) or []
        except serializers.ValidationError:
            error = "That page link is no longer valid; start from the first page."
    else:
        error = " ".join(f"{field}: {' '.join(msgs)}" for field, msgs in entries.errors.items())
    return render(
        request,
        "api/audit.html",
        {
            "entries": page,
            "filters": entries.form,
            "auth_methods": [m for m, _ in AUTH_METHODS],
            "next": paginator.get_next_link() if page else None,
            "previous": paginator.get_previous_link() if page else None,
            "error": error,
            "nav": "audit",
        },
        status=400 if error else 200,
    )


class _AuditOrder:
    cursor_ordering = ("-at", "-id")
