"""Admin for the cluster inventory: nodes with their GPUs, drain and undrain; join tokens (made
here, shown once) and nodes' credentials (revoked here)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from console.cluster import tokens
from console.cluster.actions import drain_node, undrain_node
from console.cluster.models import Gpu, JoinToken, Node, NodeCredential
from console.core.models import AuditEntry
from console.core.states import IllegalTransition


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    # GPUs are what the agent reported over NVML; editing them here would only be overwritten.
    readonly_fields = ("index", "name", "uuid", "memory_bytes", "utilization", "memory_used_bytes")
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "state",
        "hostname",
        "address",
        "cpus",
        "gpu_count",
        "cpu_percent",
        "memory_percent",
        "last_heartbeat",
        "credential",
    )
    list_filter = ("state", "gpus__name")
    search_fields = ("name", "hostname", "address", "gpus__name", "gpus__uuid")
    inlines = [GpuInline]
    actions = ["drain", "undrain"]
    # State moves only through drain/undrain (audited) or the controller; the rest comes from
    # the agent's registration and heartbeats.
    readonly_fields = (
        "state",
        "cpus",
        "memory_bytes",
        "agent_version",
        "torch_version",
        "cpu_percent",
        "memory_percent",
        "registered_at",
        "last_heartbeat",
        "agent_session",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        own = NodeCredential.objects.filter(node_name=OuterRef("name"))
        return super().get_queryset(request).annotate(credential_revoked=Subquery(own.values("revoked")[:1]))

    @admin.display(description="Credential")
    def credential(self, node: Node) -> str:
        """The node's own credential (Admin → Node credentials), or the shared token when none."""
        revoked = getattr(node, "credential_revoked", None)
        return "shared token" if revoked is None else ("revoked" if revoked else "own")

    @admin.display(description="GPUs")
    def gpu_count(self, node: Node) -> int:
        return node.gpus.count()

    @admin.action(description="Drain selected nodes")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._apply(request, queryset, drain_node, "draining")

    @admin.action(description="Undrain selected nodes (take work again)")
    def undrain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._apply(request, queryset, undrain_node, "online")

    def _apply(self, request: HttpRequest, queryset: QuerySet[Node], action: object, verb: str) -> None:
        assert callable(action)
        done: list[str] = []
        for node in queryset:
            try:
                action(node.pk, request.user)
            except IllegalTransition as exc:
                self.message_user(request, f"{node.name}: {exc}", messages.ERROR)
            else:
                done.append(node.name)
        if done:
            self.message_user(request, f"{', '.join(done)}: {verb}", messages.SUCCESS)


class JoinTokenForm(forms.ModelForm):
    hours = forms.FloatField(
        initial=tokens.DEFAULT_JOIN_TOKEN_HOURS,
        min_value=0.01,
        max_value=tokens.MAX_JOIN_TOKEN_HOURS,
        help_text="Hours until it expires, if no host used it.",
    )

    class Meta:
        model = JoinToken
        fields = ["name", "node_name"]


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    """Made here (the raw token is shown once, in the message after saving), never edited."""

    list_display = (
        "name",
        "prefix",
        "node_name",
        "created_by",
        "created_at",
        "expires_at",
        "used_at",
        "used_by",
    )
    search_fields = ("name", "prefix", "node_name", "used_by")
    readonly_fields = list_display

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = JoinTokenForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ("name", "node_name", "hours")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: JoinToken, form: Any, change: bool) -> None:
        token, raw = tokens.issue_join_token(
            request.user, obj.name, obj.node_name, form.cleaned_data["hours"]
        )
        obj.pk = token.pk
        obj.refresh_from_db()
        AuditEntry.record(
            request.user, "node.join_token_created", token, name=token.name, node=token.node_name
        )
        self.message_user(
            request,
            f"Join token {token.name!r} (shown this once, copy it now): {raw}  "
            f"On the new host: TRAINYARD_JOIN_TOKEN={raw} python -m workers.agent --name NAME "
            "--console URL --broker URL",
            messages.WARNING,
        )


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Each node's own credential (the agent received it at enrolment); revoke to refuse the node."""

    list_display = ("node_name", "prefix", "created_at", "revoked", "revoked_at", "last_refused_at")
    list_filter = ("revoked",)
    search_fields = ("node_name", "prefix")
    readonly_fields = (
        "node_name",
        "prefix",
        "created_at",
        "join_token",
        "revoked",
        "revoked_at",
        "last_refused_at",
    )
    exclude = ("secret_hash",)
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # credentials come from enrolment with a join token

    @admin.action(description="Revoke the selected nodes' credentials")
    def revoke(self, request: HttpRequest, queryset: QuerySet[NodeCredential]) -> None:
        done = [c.node_name for c in queryset if tokens.revoke(c, request.user)]
        if done:
            self.message_user(
                request,
                f"revoked: {', '.join(done)} (their messages are refused from now on)",
                messages.SUCCESS,
            )
