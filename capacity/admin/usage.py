"""Hourly usage (read-only: the worker writes it once per closed hour), and its CSV download.

The list's "Download CSV" link carries the tenant and pool the list is
filtered by; the CSV is what `usage/hourly` and `manage.py usage --csv` answer
for the last 31 days (closed hours from the table, the open hour computed).
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from capacity.models import HourlyUsage
from capacity.selectors.usage import MAX_HOURS, UsageScope, UsageWindow, usage_csv_write, usage_rows
from capacity.usage import HOUR, hour_floor
from core.admin import ReadOnlyAdmin
from core.clock import compute_now

# The list's filters the CSV link carries, and the scope argument each one becomes.
CSV_FILTERS = {"tenant_id__exact": "tenant_id", "pool_id__exact": "pool_id"}


@admin.register(HourlyUsage)
class HourlyUsageAdmin(ReadOnlyAdmin):
    list_display = ("hour", "tenant_id", "pool_id", "project_id", "resource", "spot", "amount", "revision")
    list_filter = ("tenant_id", "resource", "spot", "revision")
    search_fields = ("tenant_id", "pool_id", "project_id")
    date_hierarchy = "hour"
    ordering = ("-hour", "tenant_id", "pool_id", "resource")

    @admin.display(description="amount (hours)")
    def amount(self, obj: HourlyUsage) -> str:
        return f"{obj.usage_us / 3_600_000_000:.6f}"

    def get_urls(self) -> list[URLPattern]:
        csv = path("csv/", self.admin_site.admin_view(self.csv_view), name="capacity_hourlyusage_csv")
        return [csv, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        query = {scope: request.GET[name] for name, scope in CSV_FILTERS.items() if request.GET.get(name)}
        url = reverse("admin:capacity_hourlyusage_csv")
        context = {
            **(extra_context or {}),
            "usage_csv_url": f"{url}?{urlencode(query)}" if query else url,
            "usage_csv_tenant": query.get("tenant_id", ""),
        }
        return super().changelist_view(request, extra_context=context)

    def csv_view(self, request: HttpRequest) -> HttpResponse | TemplateResponse:
        """The last 31 days of usage (one tenant's or pool's, or everyone's) as a CSV download."""
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        end = hour_floor(compute_now()) + HOUR
        window = UsageWindow(start=end - timedelta(hours=MAX_HOURS), end=end)
        scope = UsageScope(
            tenant_id=request.GET.get("tenant_id") or None, pool_id=request.GET.get("pool_id") or None
        )
        buffer = io.StringIO()
        usage_csv_write(usage_rows(scope=scope, window=window), buffer)
        name = f"usage-{scope.tenant_id or 'all'}-{window.start:%Y%m%dT%H}-{window.end:%Y%m%dT%H}.csv"
        response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
