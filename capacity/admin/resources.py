"""Node resources in the admin: an operator sets a scalar's capacity and overcommit ratio here.

An edit changes what the node adds to its pool's scalar rollups, so it is
saved inside `reservations.node_events.nodes_changing`, like every other node
change: the numbers move in the same transaction, and the change is audited.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.forms import ModelForm
from django.http import HttpRequest

from core.admin import admin_actor
from core.services import audit_record
from inventory.models import NodeResource
from reservations.node_events import nodes_changing


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
        with transaction.atomic(), nodes_changing([obj.node_id]):
            super().save_model(request, obj, form, change)
            audit_record(
                actor=admin_actor(request),
                action="node.resource",
                subject_type="node",
                subject_id=obj.node_id,
                data={"resource": obj.resource, "allocatable": obj.allocatable, "ratio": float(obj.ratio)},
            )
