"""Admin for the cluster inventory: nodes with their GPUs, drain and undrain."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from console.cluster.actions import drain_node, undrain_node
from console.cluster.models import Gpu, Node
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
