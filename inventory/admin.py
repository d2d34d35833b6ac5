"""The admin's plain records of the inventory: projects, taints, devices.

The operator consoles for nodes and pools (actions, buckets, timelines),
offerings and node resources (whose edits move the rollups) are in
`operations.admin`, the layer that sees bookings and rollups too.
"""

from __future__ import annotations

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from inventory.models import Device, Project, Taint

# --- simple records -------------------------------------------------------------------------


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "id", "created_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    list_select_related = ("tenant",)
    search_fields = ("id", "name", "tenant__id")
    autocomplete_fields = ("tenant",)
    readonly_fields = ("id", "created_at")


@admin.register(Taint)
class TaintAdmin(ReadOnlyAdmin):
    """Read-only: the taint services keep the node's `noschedule_taints` in step."""

    list_display = ("node", "key", "value", "effect", "reason", "created_by", "created_at")
    list_filter = ("effect",)
    list_select_related = ("node",)
    search_fields = ("node__hostname", "key", "value", "reason")


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = (
        "uid",
        "node",
        "device_class",
        "parent",
        "healthy",
        "bookable",
        "model_or_profile",
        "vanished_at",
    )
    list_filter = ("device_class", "healthy", "bookable", ("vanished_at", admin.EmptyFieldListFilter))
    list_select_related = ("node", "parent")
    search_fields = ("uid", "node__hostname")
    # Health goes through device_set_health (node page); the rest comes from node reports.
    readonly_fields = (
        "uid",
        "node",
        "device_class",
        "parent",
        "attributes",
        "healthy",
        "bookable",
        "vanished_at",
        "created_at",
        "updated_at",
    )

    @admin.display(description="model")
    def model_or_profile(self, obj: Device) -> str:
        return str(obj.attributes.get("gpuModel") or obj.attributes.get("migProfile") or "")
