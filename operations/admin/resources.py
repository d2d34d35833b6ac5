"""Node resources in the admin: an operator sets a scalar's capacity and overcommit ratio here.

An edit changes what the node adds to its pool's scalar rollups, so it is
saved through `operations.services.node_resource_save`, like every other node
change: the numbers move in the same transaction, and the change is audited.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from core.admin import admin_actor
from inventory.models import NodeResource
from operations.services import node_resource_save


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

    def save_model(self, request: HttpRequest, obj: NodeResource, form: ModelForm, change: bool) -> None:
        node_resource_save(resource=obj, actor=admin_actor(request))
