"""The admin's plain records of the inventory: projects, offerings, taints, node resources, devices.

The operator consoles for nodes and pools (actions, buckets, timelines) are in
`capacity.admin`, the layer that sees bookings and rollups too.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import ReadOnlyAdmin
from inventory.models import Device, NodeResource, Offering, Project, Taint

# --- simple records -------------------------------------------------------------------------


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "id", "created_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    list_select_related = ("tenant",)
    search_fields = ("id", "name", "tenant__id")
    autocomplete_fields = ("tenant",)
    readonly_fields = ("id", "created_at")


@admin.register(Offering)
class OfferingAdmin(admin.ModelAdmin):
    list_display = ("pool", "tenant", "created_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    list_select_related = ("pool", "tenant")
    search_fields = ("pool__name", "pool__id", "tenant__id")
    autocomplete_fields = ("pool", "tenant")


@admin.register(Taint)
class TaintAdmin(ReadOnlyAdmin):
    """Read-only: the taint services keep the node's `noschedule_taints` in step."""

    list_display = ("node", "key", "value", "effect", "reason", "created_by", "created_at")
    list_filter = ("effect",)
    list_select_related = ("node",)
    search_fields = ("node__hostname", "key", "value", "reason")


@admin.register(NodeResource)
class NodeResourceAdmin(admin.ModelAdmin):
    list_display = ("node", "resource", "allocated", "allocatable", "ratio", "capacity")
    list_filter = ("resource",)
    list_select_related = ("node",)
    search_fields = ("node__hostname",)
    # `allocated` moves only through the guarded UPDATE of guard 3.
    readonly_fields = ("node", "resource", "allocated")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="floor(allocatable * ratio)")
    def capacity(self, obj: NodeResource) -> int:
        return int(obj.allocatable * obj.ratio)


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
