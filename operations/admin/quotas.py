"""Quotas in the admin: an offering's limits, `max` editable through the ledger's own write."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ledger.models import QuotaUsage
from ledger.services.quota import quota_limit_set


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
