"""The node console: the nodes list by bucket, a node's page, and the actions' reason pages.

Everything that changes whether a node or an atom is schedulable goes through
the services in `operations.services` (they write the node or device row the
placer locks, keep `noschedule_taints` in step and write the audit trail);
the actions are listed in `node_actions`, and this module only asks for a
reason, calls them and reports what moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from capacity import charts
from capacity.selectors.pools import at_risk_reservations
from core.admin import admin_actor, copyable_id_column, ops_page_context, plural
from core.errors import DomainError
from inventory.models import Device, Node
from inventory.schedulability import BUCKETS, EXCLUDED, SCHEDULABLE, node_bucket, predicate_terms
from inventory.selectors import node_bucket_expression
from operations.admin.console import (
    AT_RISK_SHOWN,
    ConditionFilter,
    ConsoleAdmin,
    at_risk_context,
    can_operate,
)
from operations.admin.maintenance import plan_maintenance_action, plan_maintenance_view
from operations.admin.node_actions import OPERATION_LABELS, DeviceHealthForm, NodeOperation, node_operations
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

# The windows the node page's booking chart offers, in hours (a quarter of each is past).
GANTT_HOURS = (6, 24, 72, 168)


def _gantt_hours(request: HttpRequest) -> int:
    """The chart's window from `?gantt=<hours>`, one of `GANTT_HOURS` (24 unless asked)."""
    asked = request.GET.get("gantt", "")
    return int(asked) if asked.isdigit() and int(asked) in GANTT_HOURS else 24


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


def _operation_action(op: str) -> Callable[..., HttpResponse]:
    """A changelist action that renders the operation's reason page for the selected nodes.

    The page posts the node ids in its body to the operation's URL, so a large
    selection never has to fit in a URL.
    """

    def action(modeladmin: NodeAdmin, request: HttpRequest, queryset: QuerySet[Node]) -> HttpResponse:
        operation = node_operations()[op]
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
    actions = [*(_operation_action(op) for op in OPERATION_LABELS), plan_maintenance_action]

    node_id = copyable_id_column()

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
            ("maintenance/plan/", self.plan_maintenance_view, "inventory_node_plan_maintenance"),
        ]

    def plan_maintenance_view(self, request: HttpRequest) -> HttpResponse:
        """The impact page of a planned window, then its booking (`operations.admin.maintenance`)."""
        return plan_maintenance_view(self, request)

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
            **at_risk_context(at_risk_reservations(node_id=node.pk, limit=AT_RISK_SHOWN)),
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
        operations = node_operations()
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
            changes = self._operate_each(request, operation, nodes, form.cleaned_data)
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

    def _operate_each(
        self, request: HttpRequest, operation: NodeOperation, nodes: list[Node], data: dict[str, Any]
    ) -> list[NodeChange]:
        """Call the operation's service on each node; what moved on each one it did not refuse.

        A refusal (`DomainError`) is said for its node and the others go on.
        """
        changes: list[NodeChange] = []
        actor = admin_actor(request)
        for node in nodes:
            before = node_operator_state(node=node)
            bucket_before, atoms_before = node_bucket(node), node_allocatable_atoms(node=node)
            try:
                operation.call(node, data, actor)
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
        return changes

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
