"""Admin for jobs, rounds, bundles and checkpoints.

Everything the controller decides (state, rounds, restarts, allocations) is read-only here:
changing it by hand would bypass the state machine and the agents would never hear of it.
Operators change jobs through the pages, the API or the CLI.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from console.jobs.models import Allocation, Bundle, Checkpoint, Job, Round


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class RoundInline(ReadOnlyInline):
    model = Round
    fields = (
        "number",
        "reason",
        "world_size",
        "master_addr",
        "master_port",
        "charged",
        "state",
        "outcome",
        "created_at",
    )
    readonly_fields = fields


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "state",
        "nnodes",
        "round_number",
        "restarts",
        "owner",
        "priority",
        "created_at",
    )
    list_filter = ("state", "strategy", "precision")
    search_fields = ("name", "workload", "entrypoint", "owner__username")
    date_hierarchy = "created_at"
    inlines = [RoundInline]  # console/telemetry/admin.py adds the job's events
    readonly_fields = (
        "state",
        "round_number",
        "restarts",
        "progress",
        "failure",
        "created_at",
        "started_at",
        "finished_at",
    )
    fieldsets = (
        (None, {"fields": ("name", "owner", "priority")}),
        (
            "What runs",
            {"fields": ("workload", "entrypoint", "args", "bundle", "workdir", "env", "hyperparameters")},
        ),
        (
            "Shape",
            {
                "fields": (
                    ("min_nodes", "max_nodes", "desired_nodes"),
                    ("nproc_per_node", "gpus_per_proc"),
                    ("strategy", "precision", "grad_accum_steps"),
                    ("max_restarts", "grace_period"),
                )
            },
        ),
        ("Life (controller)", {"fields": readonly_fields}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> tuple[str, ...]:
        if obj is None:
            return self.readonly_fields
        # Once submitted, the node range is the controller's to act on (resize goes through
        # the API so a new round is made); only descriptive fields stay editable.
        return (
            *self.readonly_fields,
            "min_nodes",
            "max_nodes",
            "desired_nodes",
            "nproc_per_node",
            "gpus_per_proc",
            "workload",
            "entrypoint",
            "args",
            "bundle",
            "workdir",
            "env",
            "hyperparameters",
            "strategy",
            "precision",
            "grad_accum_steps",
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Jobs are submitted through the API so the controller is told about them.
        return False


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = ("node_rank", "node", "nproc", "gpu_indices", "state", "exit_info")
    readonly_fields = fields
    show_change_link = False


@admin.register(Round)
class RoundAdmin(admin.ModelAdmin):
    list_display = (
        "job",
        "number",
        "reason",
        "world_size",
        "master_addr",
        "master_port",
        "state",
        "outcome",
        "created_at",
    )
    list_filter = ("state", "reason", "outcome")
    search_fields = ("job__name",)
    inlines = [AllocationInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Bundle)
class BundleAdmin(admin.ModelAdmin):
    list_display = ("filename", "sha256", "size_bytes", "owner", "created_at")
    search_fields = ("filename", "sha256", "owner__username")
    readonly_fields = ("sha256", "size_bytes", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A bundle row without its archive on disk would be useless; upload via the API/CLI.
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("job", "round_number", "step", "path", "size_bytes", "blocking_ms", "created_at")
    search_fields = ("job__name", "path")
    list_filter = ("created_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
