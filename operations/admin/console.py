"""What the pool and node consoles share: the console base class, who may act, and the at-risk list.

A console is a model admin whose change page shows the live state of one pool
or node and links to pages of its own; staff without `inventory.operate_nodes`
see the same pages without their actions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import path, reverse

OPERATE_PERMISSION = "inventory.operate_nodes"

# At-risk reservations listed on a pool or node page; the pool page also shows the full count.
AT_RISK_SHOWN = 50


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


class ConditionFilter(admin.SimpleListFilter):
    """A list filter whose choices are fixed conditions: `conditions` maps a value to its label and Q."""

    conditions: dict[str, tuple[str, Q]] = {}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.conditions.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.conditions.get(self.value() or "")
        return queryset.filter(chosen[1]) if chosen else queryset


def at_risk_context(reservations: list[Any]) -> dict[str, Any]:
    """The at-risk panel of a pool or node page: each reservation linked to its admin page.

    `reservations` is at most `AT_RISK_SHOWN` long (`at_risk_reservations(limit=...)`).
    """
    rows = [
        {
            "reservation": r,
            "url": reverse("admin:reservations_reservation_change", args=[quote(r.pk)]),
        }
        for r in reservations
    ]
    return {"at_risk": rows, "at_risk_shown": AT_RISK_SHOWN}
