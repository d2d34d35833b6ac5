"""The pools' rollup rows, read-only: the booking deltas and the rebuild write them, capacity reads them."""

from __future__ import annotations

from django.contrib import admin

from capacity import charts
from core.admin import ReadOnlyAdmin
from reservations.models import PoolCapacityRollup


@admin.register(PoolCapacityRollup)
class PoolCapacityRollupAdmin(ReadOnlyAdmin):
    list_display = (
        "pool",
        "resource",
        "bar",
        "total",
        "allocatable",
        "allocated",
        "reserved",
        "available",
        "maintenance",
        "unhealthy",
        "unreachable",
        "provisioning",
        "updated_at",
        "rebuilt_at",
    )
    list_filter = ("resource", ("pool", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("pool", "pool__owner")
    search_fields = ("pool__name", "pool__id")

    @admin.display(description="capacity")
    def bar(self, obj: PoolCapacityRollup) -> str:
        return charts.rollup_bar_svg(row=obj, width=220, legend=False)
