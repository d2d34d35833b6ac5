"""The operator consoles for nodes and pools: buckets, actions with reasons, atoms, timelines.

Everything that changes whether a node or an atom is schedulable goes through
the services in `inventory.services.nodes` (they write the node or device row the
placer locks, keep `noschedule_taints` in step and write the audit trail);
this module only asks for a reason, calls them and reports what moved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, DateTimeField, Func, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from capacity.selectors.pools import at_risk_reservations, pool_at_risk_count, pool_fragmentation
from core.admin import OptionalReasonForm, ReasonForm, admin_actor, copyable_id, ops_page_context, plural
from core.errors import DomainError
from inventory.models import Device, Node, Pool, TaintEffect
from inventory.schedulability import BUCKETS, EXCLUDED, SCHEDULABLE, node_bucket, predicate_terms
from inventory.selectors import node_bucket_expression
from ledger.models import ROLLUP_COUNTS, PoolCapacityRollup
from operations import charts
from operations.selectors import (
    GPU_ATOM_CLASSES,
    NodeChange,
    node_allocatable_atoms,
    node_allocatable_gpus,
    node_atoms,
    node_audit_trail,
    node_change_summary,
    node_gantt,
    node_operator_state,
    node_scalars,
)

OPERATE_PERMISSION = "inventory.operate_nodes"


def can_operate(request: HttpRequest) -> bool:
    """Staff without the permission may look at the fleet, never act on it."""
    return bool(request.user.has_perm(OPERATE_PERMISSION))


class ConsoleAdmin(admin.ModelAdmin):
    """A model admin whose change page is an operator console.

    `console_context` fills the change page; `console_urls` puts the console's
    own pages in front of the admin's, behind the admin's login.
    """

    def console_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def console_urls(self) -> list[tuple[str, Callable[..., HttpResponse], str]]:
        """(route, view, URL name) of each page of the console's own."""
        return []

    def get_urls(self) -> list[Any]:
        own = [
            path(route, self.admin_site.admin_view(view), name=name)
            for route, view, name in self.console_urls()
        ]
        return [*own, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # The changelist links quote the primary key (`node_01…` → `node_5F01…`); the
        # admin's own views unquote it, and so must ours.
        extra = {**self.console_context(request, unquote(object_id)), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra)


def _gpu_atom_count(**filters: Any) -> Coalesce:
    atoms = (
        Device.objects.filter(
            node=OuterRef("pk"), device_class__in=GPU_ATOM_CLASSES, bookable=True, **filters
        )
        .order_by()
        .values("node")
        .annotate(c=Count("id"))
        .values("c")
    )
    return Coalesce(Subquery(atoms, output_field=IntegerField()), 0)


# --- pools ------------------------------------------------------------------------------------

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


class ConditionFilter(admin.SimpleListFilter):
    """A list filter whose choices are fixed conditions: `conditions` maps a value to its label and Q."""

    conditions: dict[str, tuple[str, Q]] = {}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.conditions.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.conditions.get(self.value() or "")
        return queryset.filter(chosen[1]) if chosen else queryset


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

    @admin.display(description="id", ordering="id")
    def pool_id(self, obj: Pool) -> str:
        return copyable_id(obj.pk)

    @admin.display(description="nodes", ordering="n_nodes")
    def node_count(self, obj: Any) -> int:
        return int(obj.n_nodes)

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
            "at_risk": _at_risk_rows(at_risk_reservations(pool_id=pool.pk, limit=AT_RISK_SHOWN)),
            "at_risk_shown": AT_RISK_SHOWN,
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


# The windows the node page's booking chart offers, in hours (a quarter of each is past).
GANTT_HOURS = (6, 24, 72, 168)


def _gantt_hours(request: HttpRequest) -> int:
    """The chart's window from `?gantt=<hours>`, one of `GANTT_HOURS` (24 unless asked)."""
    asked = request.GET.get("gantt", "")
    return int(asked) if asked.isdigit() and int(asked) in GANTT_HOURS else 24


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
        "timeline_svg": charts.timeline_svg(timeline=data),
        "timeline": data,
        "timeline_error": error,
    }


# At-risk reservations listed on a pool or node page; the pool page also shows the full count.
AT_RISK_SHOWN = 50


def _at_risk_rows(reservations: list[Any]) -> list[dict[str, Any]]:
    """The at-risk reservations as the pages list them, each linked to its admin page."""
    return [
        {
            "reservation": r,
            "url": reverse("admin:reservations_reservation_change", args=[quote(r.pk)]),
        }
        for r in reservations
    ]


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


# --- nodes -----------------------------------------------------------------------------------


class BucketFilter(admin.SimpleListFilter):
    """Filter by the node's bucket, computed by THE bucket SQL (annotated in `get_queryset`)."""

    title = "bucket"
    parameter_name = "bucket"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(b, b) for b in (SCHEDULABLE, *BUCKETS, EXCLUDED)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(bucket=self.value()) if self.value() else queryset


class SchedulableFilter(ConditionFilter):
    title = "schedulable"
    parameter_name = "schedulable"
    conditions = {"yes": ("Yes", Q(bucket=SCHEDULABLE)), "no": ("No", ~Q(bucket=SCHEDULABLE))}


class TaintForm(forms.Form):
    key = forms.CharField(max_length=253)
    value = forms.CharField(max_length=253, required=False)
    effect = forms.ChoiceField(choices=TaintEffect.choices, initial=TaintEffect.NO_SCHEDULE)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class UntaintForm(forms.Form):
    key = forms.CharField(max_length=253)
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class DeviceHealthForm(forms.Form):
    healthy = forms.TypedChoiceField(
        choices=[("1", "healthy: may be booked"), ("0", "unhealthy: keep off new bookings")],
        coerce=lambda v: v == "1",
        widget=forms.RadioSelect,
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


@dataclass(frozen=True)
class NodeOperation:
    """One node action: its page title, its form and the service call."""

    title: str
    verb: str
    form: type[forms.Form]
    call: Callable[[Node, dict[str, Any], str], Any]
    danger: bool = False


def _ops() -> dict[str, NodeOperation]:
    # Imported when used: the services module is the one place node state is written.
    from operations import services as ops

    return {
        "cordon": NodeOperation(
            "Cordon nodes",
            "Cordoned",
            ReasonForm,
            lambda n, d, a: ops.node_cordon(node=n, reason=d["reason"], actor=a),
            danger=True,
        ),
        "uncordon": NodeOperation(
            "Uncordon nodes",
            "Uncordoned",
            OptionalReasonForm,
            lambda n, d, a: ops.node_uncordon(node=n, actor=a, reason=d["reason"]),
        ),
        "taint": NodeOperation(
            "Taint nodes",
            "Tainted",
            TaintForm,
            lambda n, d, a: ops.node_taint(
                node=n, key=d["key"], value=d["value"], effect=d["effect"], reason=d["reason"], actor=a
            ),
            danger=True,
        ),
        "untaint": NodeOperation(
            "Remove a taint",
            "Untainted",
            UntaintForm,
            lambda n, d, a: ops.node_untaint(node=n, key=d["key"], actor=a, reason=d["reason"]),
        ),
        "maintenance-on": NodeOperation(
            "Put nodes in maintenance",
            "Put in maintenance",
            ReasonForm,
            lambda n, d, a: ops.node_set_maintenance(node=n, on=True, reason=d["reason"], actor=a),
            danger=True,
        ),
        "maintenance-off": NodeOperation(
            "Take nodes out of maintenance",
            "Took out of maintenance",
            OptionalReasonForm,
            lambda n, d, a: ops.node_set_maintenance(node=n, on=False, reason=d["reason"], actor=a),
        ),
    }


OPERATION_LABELS = {
    "cordon": "Cordon",
    "uncordon": "Uncordon",
    "taint": "Taint",
    "untaint": "Untaint",
    "maintenance-on": "Maintenance on",
    "maintenance-off": "Maintenance off",
}


def _operation_action(op: str) -> Callable[..., HttpResponse]:
    """A changelist action that renders the operation's reason page for the selected nodes.

    The page posts the node ids in its body to the operation's URL, so a large
    selection never has to fit in a URL.
    """

    def action(modeladmin: NodeAdmin, request: HttpRequest, queryset: QuerySet[Node]) -> HttpResponse:
        operation = _ops()[op]
        nodes = list(queryset.select_related("pool").order_by("hostname"))
        return modeladmin.operate_page(
            request, op=op, operation=operation, nodes=nodes, form=operation.form()
        )

    action.__name__ = f"op_{op.replace('-', '_')}"
    action.short_description = f"{OPERATION_LABELS[op]} selected nodes…"  # type: ignore[attr-defined]
    action.allowed_permissions = ("operate",)  # type: ignore[attr-defined]
    return action


@admin.register(Node)
class NodeAdmin(ConsoleAdmin):
    list_display = (
        "hostname",
        "node_id",
        "pool",
        "bucket_badge",
        "gpus",
        "flags",
        "provision_state",
        "connectivity",
        "last_heartbeat_at",
    )
    list_filter = (
        BucketFilter,
        SchedulableFilter,
        "cordoned",
        "maintenance",
        "connectivity",
        "provision_state",
        "role",
        "trust",
        ("pool", admin.RelatedOnlyFieldListFilter),
    )
    list_select_related = ("pool",)
    search_fields = ("id", "hostname", "pool__name", "cordon_reason", "maintenance_reason")
    list_per_page = 100
    change_form_template = "admin/inventory/node/change_form.html"
    change_list_template = "admin/inventory/node/change_list.html"
    fieldsets = (
        (None, {"fields": ("id", "hostname", "pool", "labels")}),
        (
            "Eligibility (changed only through the actions above)",
            {
                "classes": ("collapse",),
                "fields": (
                    ("role", "trust", "owner"),
                    ("provision_state", "connectivity", "converged_specs"),
                    ("maintenance", "maintenance_reason"),
                    ("cordoned", "cordon_reason", "cordoned_by", "cordoned_at"),
                    "noschedule_taints",
                    ("last_heartbeat_at", "created_at", "updated_at"),
                ),
            },
        ),
    )
    # Every field the schedulability predicate reads is written by a service
    # (cordon, taint, maintenance) or by node reports; labels are the operator's.
    readonly_fields = tuple(f for f in flatten_fieldsets(fieldsets) if f != "labels")
    actions = [_operation_action(op) for op in OPERATION_LABELS]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # nodes come from fleet files and node reports

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return can_operate(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                bucket=node_bucket_expression(),
                gpu_atoms=_gpu_atom_count(),
                gpu_atoms_healthy=_gpu_atom_count(healthy=True),
            )
        )

    @admin.display(description="id", ordering="id")
    def node_id(self, obj: Node) -> str:
        return copyable_id(obj.pk)

    @admin.display(description="bucket", ordering="bucket")
    def bucket_badge(self, obj: Any) -> str:
        return _bucket_badge(obj.bucket)

    @admin.display(description="GPUs healthy/all", ordering="gpu_atoms")
    def gpus(self, obj: Any) -> str:
        return f"{obj.gpu_atoms_healthy}/{obj.gpu_atoms}"

    @admin.display(description="why not schedulable")
    def flags(self, obj: Node) -> str:
        """The operator-set reasons, with their text, so the list answers "why" without a click."""
        parts = []
        if obj.cordoned:
            parts.append(format_html("<strong>cordoned</strong> {}", Truncator(obj.cordon_reason).chars(40)))
        if obj.maintenance:
            parts.append(
                format_html("<strong>maintenance</strong> {}", Truncator(obj.maintenance_reason).chars(40))
            )
        if obj.noschedule_taints:
            parts.append(format_html("<strong>{} NoSchedule taint(s)</strong>", obj.noschedule_taints))
        return format_html_join(mark_safe("<br>"), "{}", ((p,) for p in parts)) if parts else ""

    def console_urls(self) -> list[tuple[str, Callable[..., HttpResponse], str]]:
        return [
            ("operate/<str:op>/", self.operate_view, "inventory_node_operate"),
            ("device/<int:device_id>/health/", self.device_health_view, "inventory_node_device_health"),
        ]

    def console_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        node = get_object_or_404(Node.objects.select_related("pool", "pool__owner", "owner"), pk=object_id)
        gpus, others = node_atoms(node=node)
        operate_url = reverse("admin:inventory_node_operate", args=["OP"])
        hours = _gantt_hours(request)
        return {
            "node": node,
            "gantt": charts.gantt_svg(gantt=node_gantt(node=node, hours=hours)),
            "gantt_hours": hours,
            "gantt_choices": GANTT_HOURS,
            "terms": predicate_terms(node),
            "bucket": node_bucket(node),
            "bucket_badge": _bucket_badge(node_bucket(node)),
            "allocatable_gpus": node_allocatable_gpus(node=node),
            "gpu_rows": gpus,
            "other_rows": others,
            "scalars": node_scalars(node=node),
            "taints": list(node.taints.order_by("key")),
            "audit_events": list(node_audit_trail(node=node)),
            "at_risk": _at_risk_rows(at_risk_reservations(node_id=node.pk, limit=AT_RISK_SHOWN)),
            "at_risk_shown": AT_RISK_SHOWN,
            "can_operate": can_operate(request),
            # Only the actions that would change something: at 3 a.m. a cordoned
            # node offers "Uncordon", not both.
            "operations": [
                (op, label, operate_url.replace("OP", op) + f"?ids={node.pk}&next=node")
                for op, label in OPERATION_LABELS.items()
                if op not in _moot_operations(node)
            ],
            "untaint_url": operate_url.replace("OP", "untaint") + f"?ids={node.pk}&next=node",
        }

    def operate_view(self, request: HttpRequest, op: str) -> HttpResponse:
        """The intermediate page of every node action: the nodes, the form, then the service calls."""
        if not can_operate(request):
            raise PermissionDenied
        operations = _ops()
        if op not in operations:
            raise PermissionDenied
        operation = operations[op]
        source = request.POST if request.method == "POST" else request.GET
        ids = [i for i in source.get("ids", "").split(",") if i]
        nodes = list(Node.objects.select_related("pool").filter(pk__in=ids).order_by("hostname"))
        back_to_node = source.get("next") == "node" and len(nodes) == 1
        initial = {"key": source.get("key", "")} if op == "untaint" else {}
        form = operation.form(request.POST if request.method == "POST" else None, initial=initial)
        if request.method == "POST" and form.is_valid() and nodes:
            changes: list[NodeChange] = []
            actor = admin_actor(request)
            for node in nodes:
                before = node_operator_state(node=node)
                bucket_before, atoms_before = node_bucket(node), node_allocatable_atoms(node=node)
                try:
                    operation.call(node, form.cleaned_data, actor)
                except DomainError as exc:
                    self.message_user(request, f"{node.hostname}: {exc}", messages.ERROR)
                    continue
                node.refresh_from_db()
                changes.append(
                    NodeChange(
                        node=node,
                        bucket_before=bucket_before,
                        bucket_after=node_bucket(node),
                        atoms_before=atoms_before,
                        atoms_after=node_allocatable_atoms(node=node),
                        changed=node_operator_state(node=node) != before,
                    )
                )
            if changes:
                changed = sum(1 for c in changes if c.changed)
                unchanged = len(changes) - changed
                already = f" ({unchanged} already so)" if unchanged else ""
                summary = node_change_summary(changes=changes)
                self.message_user(
                    request,
                    f"{operation.verb} {plural(changed, 'node')}{already}; {summary}.",
                    messages.SUCCESS if changed else messages.WARNING,
                )
            if back_to_node:
                return HttpResponseRedirect(reverse("admin:inventory_node_change", args=[quote(nodes[0].pk)]))
            return HttpResponseRedirect(reverse("admin:inventory_node_changelist"))
        return self.operate_page(
            request, op=op, operation=operation, nodes=nodes, form=form, back_to_node=back_to_node
        )

    def operate_page(
        self,
        request: HttpRequest,
        *,
        op: str,
        operation: NodeOperation,
        nodes: list[Node],
        form: forms.Form,
        back_to_node: bool = False,
    ) -> HttpResponse:
        """The reason page: the nodes with their bucket and allocatable GPUs now, and the form."""
        context = {
            **ops_page_context(self, request, operation.title),
            "operation": operation,
            "op": op,
            "form": form,
            "nodes": nodes,
            "ids": ",".join(n.pk for n in nodes),
            "next": "node" if back_to_node else "",
            "operate_url": reverse("admin:inventory_node_operate", args=[op]),
            "node_rows": [(n, _bucket_badge(node_bucket(n)), node_allocatable_gpus(node=n)) for n in nodes],
        }
        return TemplateResponse(request, "admin/inventory/node/operate.html", context)

    def device_health_view(self, request: HttpRequest, device_id: int) -> HttpResponse:
        """Mark one device healthy or unhealthy through `device_set_health`, from the node page."""
        if not can_operate(request):
            raise PermissionDenied
        device = get_object_or_404(Device.objects.select_related("node", "node__pool"), pk=device_id)
        node = device.node
        initial = {"healthy": request.GET.get("healthy", "0" if device.healthy else "1")}
        form = DeviceHealthForm(request.POST if request.method == "POST" else None, initial=initial)
        if request.method == "POST" and form.is_valid():
            from operations import services as ops

            before = node_allocatable_atoms(node=node)
            healthy = form.cleaned_data["healthy"]
            try:
                ops.device_set_health(
                    device=device,
                    healthy=healthy,
                    reason=form.cleaned_data["reason"],
                    actor=admin_actor(request),
                )
            except DomainError as exc:
                self.message_user(request, f"{device.uid}: {exc}", messages.ERROR)
            else:
                node.refresh_from_db()
                change = NodeChange(
                    node, node_bucket(node), node_bucket(node), before, node_allocatable_atoms(node=node)
                )
                state = "healthy" if healthy else "unhealthy"
                self.message_user(
                    request,
                    f"Marked {device.uid} {state}; {node_change_summary(changes=[change])}.",
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(reverse("admin:inventory_node_change", args=[quote(node.pk)]))
        context = {
            **ops_page_context(self, request, f"Device health: {device.uid}"),
            "device": device,
            "node": node,
            "form": form,
        }
        return TemplateResponse(request, "admin/inventory/node/device_health.html", context)


def _moot_operations(node: Node) -> set[str]:
    """Node-page buttons that would be no-ops for this node's current state."""
    moot = {"uncordon" if not node.cordoned else "cordon"}
    moot.add("maintenance-off" if not node.maintenance else "maintenance-on")
    if not node.taints.exists():
        moot.add("untaint")
    return moot


def _bucket_badge(bucket: str) -> str:
    """A badge that reads without colour: an icon and the bucket's name."""
    icon = "✔" if bucket == SCHEDULABLE else ("\u2013" if bucket == EXCLUDED else "✖")
    return format_html('<span class="bucket-badge bucket-{}">{} {}</span>', bucket, icon, bucket)
