"""Admin for workspaces (members and quotas inline) and node pools. Membership and quota changes
made here are audited like any other (console/teams/receivers.py)."""

from __future__ import annotations

from django.contrib import admin

from console.teams.models import Membership, NodePool, Quota, Workspace


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ("name", "weight", "everyone", "member_count", "created_at")
    search_fields = ("name", "description")
    inlines = [MembershipInline, QuotaInline]

    @admin.display(description="members")
    def member_count(self, workspace: Workspace) -> int:
        return workspace.memberships.count()


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ("name", "selector", "resource")
    inlines = [QuotaInline]
