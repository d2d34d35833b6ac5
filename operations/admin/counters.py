"""Capacity rollups (read-only: the booking deltas and the rebuild write them) and quotas."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import ReadOnlyAdmin
from ledger.models import QuotaUsage
from ledger.services.quota import quota_limit_set
from operations import charts
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


@admin.register(QuotaUsage)
class QuotaUsageAdmin(admin.ModelAdmin):
    list_display = ("tenant", "pool", "resource", "mode", "used", "max")
    list_filter = ("resource", "mode", ("tenant", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("tenant", "pool", "pool__owner")
    search_fields = ("tenant__id", "pool__name", "pool__id")
    autocomplete_fields = ("pool", "tenant")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # `used` moves only through the guarded UPDATE of guard 5; `max` and `mode` are the operator's.
        if obj is not None:
            return ("pool", "tenant", "resource", "used")
        return ("used",)

    def save_model(self, request: HttpRequest, obj: QuotaUsage, form: Any, change: bool) -> None:
        # The ledger writes its own table: a counter limit below what is in use is raised
        # to it, as a fleet file's would be, instead of failing on the CHECK.
        quota_limit_set(
            pool_id=obj.pool_id, tenant_id=obj.tenant_id, resource=obj.resource, limit=obj.max, mode=obj.mode
        )
        saved = QuotaUsage.objects.get(pool_id=obj.pool_id, tenant_id=obj.tenant_id, resource=obj.resource)
        obj.pk, obj.used, obj.max, obj.mode = saved.pk, saved.used, saved.max, saved.mode
