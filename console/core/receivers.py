"""Audit entries for what Django itself does on a person's behalf: sign-ins, sign-outs, failed
sign-ins, lockouts and edits through the admin."""

from __future__ import annotations

import contextvars
from typing import Any

from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.http import HttpRequest

from console.core.audit import AuthMethod, current_request, with_request
from console.core.models import AuditEntry

ADMIN_ACTIONS = {ADDITION: "admin.add", CHANGE: "admin.change", DELETION: "admin.delete"}

# Set while the site-wide "delete selected" action runs; it records each deletion itself.
bulk_admin_delete: contextvars.ContextVar[bool] = contextvars.ContextVar("bulk_admin_delete", default=False)


def _login_place(request: HttpRequest | None) -> str:
    path = getattr(request, "path", "") or ""
    if path.startswith("/admin/"):
        return "admin"
    return "api" if path.startswith("/api/") else "web"


def _with(request: HttpRequest | None, write: Any) -> None:
    if request is None:
        write()
        return
    token = with_request(request)
    try:
        write()
    finally:
        token.var.reset(token)


@receiver(user_logged_in, dispatch_uid="audit_login")
def audit_login(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    _with(
        request,
        lambda: AuditEntry.record(
            user, "auth.login", user, via=AuthMethod.PASSWORD, place=_login_place(request)
        ),
    )


@receiver(user_logged_out, dispatch_uid="audit_logout")
def audit_logout(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if user is None:
        return
    _with(request, lambda: AuditEntry.record(user, "auth.logout", user, place=_login_place(request)))


@receiver(user_login_failed, dispatch_uid="audit_login_failed")
def audit_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # Failed enrolments are recorded by the enrolment itself (node.enrol_failed), with more detail.
    if credentials.get("trainyard_enrolment"):
        return
    username = str(credentials.get("username") or "")[:150]
    _with(
        request,
        lambda: AuditEntry.record_raw(
            None,
            "auth.login_failed",
            target_type="user",
            target_id=username,
            actor_name=username,
            via=AuthMethod.PASSWORD,
            place=_login_place(request),
        ),
    )


@receiver(user_locked_out, dispatch_uid="audit_locked_out")
def audit_locked_out(
    sender: Any, request: HttpRequest | None, username: str | None, ip_address: str | None, **kwargs: Any
) -> None:
    _with(
        request,
        lambda: AuditEntry.record_raw(
            None,
            "auth.locked_out",
            target_type="user" if username else "address",
            target_id=str(username or ip_address or ""),
            actor_name=str(username or ""),
            via=getattr(request, "trainyard_auth_method", "") or AuthMethod.PASSWORD,
        ),
    )


@receiver(post_save, sender=LogEntry, dispatch_uid="audit_admin_edit")
def audit_admin_edit(sender: Any, instance: LogEntry, created: bool, **kwargs: Any) -> None:
    if not created or bulk_admin_delete.get():
        return
    AuditEntry.record_raw(
        instance.user,
        ADMIN_ACTIONS.get(instance.action_flag, "admin.edit"),
        target_type=instance.content_type.model if instance.content_type else "",
        target_id=str(instance.object_id or ""),
        via=AuthMethod.SESSION,
        object=instance.object_repr,
        change=instance.get_change_message(),
    )


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="audit_password_changed")
def audit_password_changed(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    """Every way a password changes (the password-change page, the admin, ``changepassword``,
    ``createadmin``) goes through ``set_password`` and ``save``; Django keeps the new raw password
    in ``_password`` until the save has run (to tell the validators), which is how a change is
    told from another edit. The actor is whoever made the request (the user, or an admin)."""
    if created or getattr(instance, "_password", None) is None:
        return
    request = current_request()
    actor = getattr(request, "user", None) if request is not None else None
    AuditEntry.record(
        actor,
        "auth.password_changed",
        instance,
        user=instance.get_username(),
        by_self=bool(actor is not None and getattr(actor, "pk", None) == instance.pk),
    )
