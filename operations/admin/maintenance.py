"""The node list's "Plan maintenance" action: ask for the window, show its impact, then book it.

Three steps on one URL, each a CSRF-protected POST carrying the node ids in
its body: the form (from, to, reason), the impact page (what
`maintenance_plan` says scheduling would do, nothing written), and the
confirmation, which calls `maintenance_schedule`. Every rule about windows
lives in `reservations.maintenance`; this module only parses the form, calls
the services and reports what they said.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from core.admin import admin_actor, ops_page_context
from core.clock import compute_now
from core.errors import DomainError
from inventory.models import Node
from operations.admin.console import can_operate
from reservations.maintenance.selectors import MaintenancePlan, maintenance_plan
from reservations.maintenance.services import MOVED, RUNNING, STUCK, maintenance_schedule
from reservations.maintenance.windows import window_phrase

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TITLE = "Plan maintenance"
# The form's fields; the service's field names (`from`, `to`) map onto them for its errors.
_SERVICE_FIELDS = {"from": "starts_at", "to": "ends_at", "reason": "reason"}
_TIME_HELP = "UTC, as YYYY-MM-DD HH:MM"


class MaintenanceWindowForm(forms.Form):
    """The window to plan: `[starts_at, ends_at)` in UTC and the reason every refusal will name."""

    starts_at = forms.DateTimeField(label="From", help_text=_TIME_HELP)
    ends_at = forms.DateTimeField(label="To", help_text=_TIME_HELP)
    reason = forms.CharField(
        max_length=200, help_text="named in every refusal and at-risk mark, e.g. firmware"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        starts_at, ends_at = data.get("starts_at"), data.get("ends_at")
        # The current minute is still "now": the form's times have minutes, not seconds.
        now = compute_now().replace(second=0, microsecond=0)
        if isinstance(starts_at, datetime) and starts_at < now:
            self.add_error("starts_at", "must not be in the past: a window is planned ahead")
        if isinstance(starts_at, datetime) and isinstance(ends_at, datetime) and ends_at <= starts_at:
            self.add_error("ends_at", "must be after From")
        return data


def _nodes(ids: str) -> list[Node]:
    wanted = [i for i in ids.split(",") if i]
    return list(Node.objects.select_related("pool").filter(pk__in=wanted).order_by("hostname"))


def _service_error(form: MaintenanceWindowForm, exc: DomainError) -> None:
    """A refusal of the services, on the field it names when the form has one."""
    fields = [d.get("field") for d in exc.details]
    field = next((_SERVICE_FIELDS[f] for f in fields if f in _SERVICE_FIELDS), None)
    form.add_error(field, str(exc))


def plan_page(
    modeladmin: ModelAdmin[Node],
    request: HttpRequest,
    *,
    nodes: list[Node],
    form: MaintenanceWindowForm,
    plan: MaintenancePlan | None = None,
) -> HttpResponse:
    """The form, or (with `plan`) the impact and the Confirm button."""
    context = {
        **ops_page_context(modeladmin, request, TITLE),
        "form": form,
        "nodes": nodes,
        "ids": ",".join(n.pk for n in nodes),
        "plan": plan,
        "plan_url": reverse("admin:inventory_node_plan_maintenance"),
    }
    if plan is not None:
        context.update({group: plan.count(group) for group in (RUNNING, MOVED, STUCK)})
    return TemplateResponse(request, "admin/inventory/node/plan_maintenance.html", context)


def plan_maintenance_action(
    modeladmin: ModelAdmin[Node], request: HttpRequest, queryset: QuerySet[Node]
) -> HttpResponse:
    """The changelist action: the window's form for the selected nodes."""
    nodes = list(queryset.select_related("pool").order_by("hostname"))
    return plan_page(modeladmin, request, nodes=nodes, form=MaintenanceWindowForm())


plan_maintenance_action.short_description = "Plan maintenance for the selected nodes…"  # type: ignore[attr-defined]
plan_maintenance_action.allowed_permissions = ("operate",)  # type: ignore[attr-defined]


def plan_maintenance_view(modeladmin: ModelAdmin[Node], request: HttpRequest) -> HttpResponse:
    """POST only: the impact of the posted window, or (with `confirm`) the window booked."""
    if not can_operate(request) or request.method != "POST":
        raise PermissionDenied
    nodes = _nodes(request.POST.get("ids", ""))
    form = MaintenanceWindowForm(request.POST)
    if not nodes or not form.is_valid():
        if not nodes:
            form.add_error(None, "No nodes selected.")
        return plan_page(modeladmin, request, nodes=nodes, form=form)
    data, ids, actor = form.cleaned_data, [n.pk for n in nodes], admin_actor(request)
    window = {"starts_at": data["starts_at"], "ends_at": data["ends_at"], "reason": data["reason"]}
    try:
        if "confirm" not in request.POST:
            plan = maintenance_plan(node_ids=ids, actor=actor, **window)
            return plan_page(modeladmin, request, nodes=nodes, form=form, plan=plan)
        impact = maintenance_schedule(node_ids=ids, actor=actor, **window)
    except DomainError as exc:
        _service_error(form, exc)
        return plan_page(modeladmin, request, nodes=nodes, form=form)
    counts = {g: len(impact.by_group(g)) for g in (MOVED, STUCK, RUNNING)}
    phrase = window_phrase(
        reason=impact.window.reason,
        node_ids=tuple(impact.node_ids),
        starts_at=impact.window.starts_at,
        ends_at=impact.window.ends_at,
    )
    modeladmin.message_user(
        request,
        f"Scheduled {phrase} ({impact.window.pk}): {counts[MOVED]} moved, {counts[STUCK]} at risk,"
        f" {counts[RUNNING]} running that would have to end.",
        messages.SUCCESS,
    )
    return HttpResponseRedirect(reverse("admin:inventory_node_changelist"))


__all__ = [
    "MaintenanceWindowForm",
    "plan_maintenance_action",
    "plan_maintenance_view",
]
