"""The pool console: the pools list with each pool's capacity bar, and a pool's page.

The page shows the pool's rollup rows, its at-risk reservations, its
fragmentation and its timeline; an operator may rebuild its rollups from there
(`reservations.rollups.recount.rollup_rebuild`, audited).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, DateTimeField, Func, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse

from capacity import charts
from capacity.selectors.pools import at_risk_reservations, pool_at_risk_count, pool_fragmentation
from core.admin import admin_actor, copyable_id_column, count_column
from core.errors import DomainError
from inventory.models import Node, Pool
from operations.admin.console import (
    AT_RISK_SHOWN,
    ConditionFilter,
    ConsoleAdmin,
    at_risk_context,
    can_operate,
)
from reservations.maintenance.windows import WindowRef, windows_overlapping
from reservations.models import ROLLUP_COUNTS, PoolCapacityRollup

ROLLUP_COLUMNS = ROLLUP_COUNTS


@dataclass(frozen=True)
class RollupView:
    """A rollup row rebuilt from the list query's annotations, for the bar."""

    total: int
    allocatable: int
    allocated: int
    reserved: int
    available: int
    provisioning: int
    unhealthy: int
    maintenance: int
    unreachable: int


class PoolArchivedFilter(ConditionFilter):
    title = "archived"
    parameter_name = "archived"
    conditions = {
        "no": ("Live", Q(archived_at__isnull=True)),
        "yes": ("Archived", Q(archived_at__isnull=False)),
    }


@admin.register(Pool)
class PoolAdmin(ConsoleAdmin):
    list_display = (
        "name",
        "pool_id",
        "owner",
        "gpu_model",
        "sharing",
        "node_count",
        "gpu_capacity",
        "rollup_age",
    )
    list_filter = ("sharing", "gpu_model", PoolArchivedFilter, ("owner", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("owner",)
    search_fields = ("id", "name", "owner__id", "gpu_model")
    autocomplete_fields = ("owner",)
    readonly_fields = ("id", "created_at")
    change_form_template = "admin/inventory/pool/change_form.html"
    change_list_template = "admin/inventory/pool/change_list.html"

    pool_id = copyable_id_column()
    node_count = count_column("n_nodes", "nodes")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # Changing how a live pool shares its GPUs would strand every atom: not from here.
        if obj is not None:
            return ("id", "owner", "sharing", "slots_per_gpu", "created_at")
        return ("id", "created_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # archive instead; nodes and reservations refer to pools

    def get_queryset(self, request: HttpRequest) -> QuerySet[Pool]:
        # The pool's `gpu` rollup row and its node count, as columns of the one list query.
        gpu_row = PoolCapacityRollup.objects.filter(pool=OuterRef("pk"), resource="gpu")
        annotations: dict[str, Any] = {
            f"gpu_{c}": Subquery(gpu_row.values(c)[:1], output_field=IntegerField()) for c in ROLLUP_COLUMNS
        }
        annotations["gpu_updated_at"] = Subquery(
            gpu_row.values("updated_at")[:1], output_field=DateTimeField()
        )
        annotations["db_now"] = Func(function="compute_now", output_field=DateTimeField())
        annotations["n_nodes"] = Coalesce(
            Subquery(
                Node.objects.filter(pool=OuterRef("pk"))
                .order_by()
                .values("pool")
                .annotate(c=Count("id"))
                .values("c"),
                output_field=IntegerField(),
            ),
            0,
        )
        return super().get_queryset(request).annotate(**annotations)

    @admin.display(description="GPUs (gpu rollup)")
    def gpu_capacity(self, obj: Any) -> str:
        if obj.gpu_total is None:
            return "no rollup yet"
        row = RollupView(**{c: int(getattr(obj, f"gpu_{c}") or 0) for c in ROLLUP_COLUMNS})
        return charts.rollup_bar_svg(row=row, width=300)

    @admin.display(description="rollup age", ordering="gpu_updated_at")
    def rollup_age(self, obj: Any) -> str:
        if obj.gpu_updated_at is None:
            return "—"
        return _age(obj.db_now, obj.gpu_updated_at)

    def console_urls(self) -> list[tuple[str, Callable[..., HttpResponse], str]]:
        return [("<path:object_id>/rebuild/", self.rebuild_view, "inventory_pool_rebuild")]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"capacity_legend": charts.legend_html(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def console_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        pool = get_object_or_404(Pool, pk=object_id)
        rows = list(
            PoolCapacityRollup.objects.filter(pool=pool)
            .annotate(db_now=Func(function="compute_now", output_field=DateTimeField()))
            .order_by("resource")
        )
        return {
            "rollups": [
                {
                    "row": r,
                    "bar": charts.rollup_bar_svg(row=r, width=180, legend=False),
                    "age": _age(r.db_now, r.updated_at),
                }
                for r in rows
            ],
            "capacity_legend": charts.legend_html(),
            "can_operate": can_operate(request),
            "rebuild_url": reverse("admin:inventory_pool_rebuild", args=[quote(pool.pk)]),
            "nodes_url": reverse("admin:inventory_node_changelist") + f"?pool__id__exact={pool.pk}",
            "at_risk_count": pool_at_risk_count(pool_id=pool.pk),
            **at_risk_context(at_risk_reservations(pool_id=pool.pk, limit=AT_RISK_SHOWN)),
            "fragmentation": pool_fragmentation(pool_id=pool.pk, sharing=pool.sharing),
            **_timeline_context(request, pool),
        }

    def rebuild_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST only: rebuild this pool's rollup rows now, then back to the pool page."""
        if request.method != "POST" or not can_operate(request):
            raise PermissionDenied
        pool = get_object_or_404(Pool, pk=unquote(object_id))
        from reservations.rollups.recount import rollup_rebuild

        rollup_rebuild(pool_id=pool.pk)
        from core.services import audit_record

        audit_record(
            actor=admin_actor(request), action="pool.rollup.rebuild", subject_type="pool", subject_id=pool.pk
        )
        self.message_user(request, f"Rebuilt the capacity rollup of {pool}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:inventory_pool_change", args=[quote(pool.pk)]))


class TimelineForm(forms.Form):
    hours = forms.IntegerField(required=False, min_value=1, max_value=24 * 90, label="window (hours)")
    step_minutes = forms.IntegerField(required=False, min_value=1, max_value=24 * 60, label="step (minutes)")


def _timeline_context(request: HttpRequest, pool: Pool) -> dict[str, Any]:
    """The pool's timeline chart; an empty chart with the error when the module refuses."""
    form = TimelineForm(request.GET or None)
    kwargs: dict[str, Any] = {"from_ms": None, "to_ms": None, "step_minutes": None}
    if form.is_bound and form.is_valid():
        if form.cleaned_data.get("step_minutes"):
            kwargs["step_minutes"] = form.cleaned_data["step_minutes"]
        if form.cleaned_data.get("hours"):
            from core.clock import compute_now, to_millis

            start = to_millis(compute_now())
            assert start is not None
            kwargs["from_ms"] = start
            kwargs["to_ms"] = start + form.cleaned_data["hours"] * 3_600_000
    try:
        from capacity.selectors.timeline import timeline_compute

        data = timeline_compute(pool=pool, **kwargs)
        error = ""
    except (ImportError, DomainError) as exc:
        data, error = {"allocatable": 0, "buckets": []}, str(exc)
    rows = [
        {
            "start": datetime.fromtimestamp(int(b["start"]) / 1000, tz=UTC),
            "end": datetime.fromtimestamp(int(b["end"]) / 1000, tz=UTC),
            "booked": b.get("booked", 0),
            "free": b.get("free", 0),
        }
        for b in data.get("buckets") or []
    ]
    return {
        "timeline_rows": rows,
        "timeline_form": form,
        "timeline_svg": charts.timeline_svg(timeline=data, windows=_timeline_windows(pool, rows)),
        "timeline": data,
        "timeline_error": error,
    }


def _timeline_windows(pool: Pool, rows: list[dict[str, Any]]) -> list[WindowRef]:
    """The live maintenance windows on the pool's nodes that overlap the chart's range."""
    if not rows:
        return []
    return windows_overlapping(start=rows[0]["start"], end=rows[-1]["end"], pool_id=pool.pk)


def _age(now: Any, then: Any) -> str:
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        seconds = 0
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    if seconds < 172800:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"
