"""Admin for principals, role bindings, tokens and the audit trail.

Also holds the small pieces every app's admin shares: the read-only base
class, the actor string written to the audit trail, the intermediate
"give a reason" page that actions render before they call a service, and the
list columns for ids and annotated counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from core import services
from core.errors import DomainError
from core.models import ApiToken, AuditEvent, Principal, Role, RoleBinding, Tenant

admin.site.site_header = "GPU capacity: operator admin"
admin.site.site_title = "GPU capacity admin"
admin.site.index_title = "Fleet, capacity and reservations"


def admin_actor(request: HttpRequest) -> str:
    """Who the audit trail names for an admin action: the Django user, marked as such."""
    return f"admin:{request.user.get_username()}"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records written only by services (bookings, rollups, the audit trail): look, never edit."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReasonForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Written to the audit trail. Say why, for the next person on call.",
    )


class OptionalReasonForm(forms.Form):
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Optional; written to the audit trail.",
    )


def ops_page_context(modeladmin: admin.ModelAdmin, request: HttpRequest, title: str) -> dict[str, Any]:
    """What every page extending `admin/ops_page.html` needs: the site's context, `title` and `opts`."""
    return {**modeladmin.admin_site.each_context(request), "title": title, "opts": modeladmin.model._meta}


def reason_action(
    *,
    title: str,
    form_class: type[forms.Form],
    done: Callable[[int], str],
    warning: str = "",
) -> Callable[[Callable[..., bool]], Callable[..., HttpResponse | None]]:
    """An admin action with an intermediate form: ask, then apply the decorated method per row.

    The method is `apply(self, request, obj, cleaned_data) -> bool`: it calls
    one service and returns whether the row changed; `done(changed)` is the
    message after. A `DomainError` from a service is shown per row, not raised.
    """

    def decorate(apply: Callable[..., bool]) -> Callable[..., HttpResponse | None]:
        @functools.wraps(apply)
        def action(
            modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any]
        ) -> HttpResponse | None:
            form = form_class(request.POST if "apply" in request.POST else None)
            if "apply" in request.POST and form.is_valid():
                changed = 0
                for obj in queryset:
                    try:
                        if apply(modeladmin, request, obj, form.cleaned_data):
                            changed += 1
                    except DomainError as exc:
                        modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
                modeladmin.message_user(
                    request, done(changed), messages.SUCCESS if changed else messages.WARNING
                )
                return None
            context = {
                **ops_page_context(modeladmin, request, title),
                "form": form,
                "objects": list(queryset),
                "action_name": apply.__name__,
                "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "warning": warning,
            }
            return TemplateResponse(request, "admin/reason_action.html", context)

        return action

    return decorate


def copyable_id(value: str) -> str:
    """An id in a list column: monospace, and one click selects all of it for copying into the API."""
    return format_html('<code style="user-select: all; white-space: nowrap">{}</code>', value)


def copyable_id_column() -> Callable[[admin.ModelAdmin, Any], str]:
    """A list's `id` column: the primary key as `copyable_id`, sorted by it."""

    @admin.display(description="id", ordering="id")
    def column(modeladmin: admin.ModelAdmin, obj: Any) -> str:
        return copyable_id(obj.pk)

    return column


def count_column(annotation: str, description: str) -> Callable[[admin.ModelAdmin, Any], int]:
    """A list column of a count that `get_queryset` annotates as `annotation`: no query per row."""

    @admin.display(description=description, ordering=annotation)
    def column(modeladmin: admin.ModelAdmin, obj: Any) -> int:
        return int(getattr(obj, annotation))

    return column


# --- principals, bindings, tokens ------------------------------------------------------------


class RoleBindingInline(admin.TabularInline):
    model = RoleBinding
    extra = 0
    fields = ("role", "tenant", "scope_pool_id", "scope_node_id", "created_at")
    readonly_fields = ("created_at",)
    autocomplete_fields = ("tenant",)


@admin.register(Principal)
class PrincipalAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "binding_count", "token_count", "created_at")
    search_fields = ("id", "name")
    readonly_fields = ("id", "created_at")
    inlines = (RoleBindingInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Principal]:
        # Counted in the list query itself, not one query per row.
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_bindings=Count("bindings", distinct=True),
                n_tokens=Count("tokens", distinct=True),
            )
        )

    binding_count = count_column("n_bindings", "bindings")
    token_count = count_column("n_tokens", "tokens")


@admin.register(RoleBinding)
class RoleBindingAdmin(admin.ModelAdmin):
    list_display = ("principal", "role", "scope", "created_at")
    list_filter = ("role", ("tenant", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("principal",)
    search_fields = ("principal__name", "principal__id", "tenant__id")
    autocomplete_fields = ("principal", "tenant")

    @admin.display(description="scope", ordering="tenant")
    def scope(self, obj: RoleBinding) -> str:
        return obj.scope_label


# The longest lifetime the form offers, as `issue_token --expires` allows (five years).
MAX_EXPIRY_DAYS = 5 * 366


class TokenIssueForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)
    tenant = forms.CharField(
        required=False,
        max_length=128,
        help_text=(
            "Viewer and member tokens need a tenant; operator, node-agent and metrics tokens must have none."
        ),
    )
    scope_pool = forms.CharField(
        required=False,
        max_length=64,
        label="Node agent: pool",
        help_text="A node-agent token reports only for this pool's nodes (pool_…).",
    )
    scope_node = forms.CharField(
        required=False,
        max_length=64,
        label="Node agent: node",
        help_text="Or only for this one node (node_…).",
    )
    all_nodes = forms.BooleanField(
        required=False,
        label="Node agent: every node",
        help_text="Or for every node of the platform. A node-agent token needs exactly one of the three.",
    )
    # Bounded as the token row and `issue_token --expires` are: a form error, never a database error.
    name = forms.CharField(
        required=False, max_length=200, help_text="Tells tokens apart, e.g. 'ci-deployer'."
    )
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_EXPIRY_DAYS, help_text="Empty: never expires."
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        chosen = [f for f in ("scope_pool", "scope_node", "all_nodes") if data.get(f)]
        if data.get("role") == Role.NODE_AGENT and len(chosen) != 1:
            # As `issue_token`: an agent that can rewrite every node must be asked for, never the default.
            raise forms.ValidationError(
                "A node-agent token needs exactly one of: a pool, a node, every node."
            )
        if data.get("role") not in (None, Role.NODE_AGENT) and chosen:
            raise forms.ValidationError("Only a node-agent token is narrowed to a pool or a node.")
        return data


def _agent_reach(data: dict[str, Any]) -> str:
    """What the issued page says a node-agent token reports for."""
    if data["scope_pool"]:
        return f"the nodes of pool {data['scope_pool']} only"
    if data["scope_node"]:
        return f"node {data['scope_node']} only"
    return "every node of the platform"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "prefix_display",
        "name",
        "principal",
        "status",
        "created_at",
        "expires_at",
        "last_used_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), ("expires_at", admin.EmptyFieldListFilter))
    list_select_related = ("principal",)
    search_fields = ("prefix", "name", "principal__name", "principal__id")
    # The digest is never shown: it is what a stolen database would need to match.
    fields = ("id", "principal", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at")
    readonly_fields = fields
    actions = ("revoke_tokens",)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the row is the audit trail's subject

    @admin.display(description="token")
    def prefix_display(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="status")
    def status(self, obj: ApiToken) -> str:
        return "revoked" if obj.revoked_at else "active"

    def get_urls(self) -> list[Any]:
        return [
            path("issue/", self.admin_site.admin_view(self.issue_view), name="core_apitoken_issue"),
            *super().get_urls(),
        ]

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        # "Add" means issuing: the secret must be generated by the service and shown once.
        return HttpResponseRedirect(reverse("admin:core_apitoken_issue"))

    def issue_view(self, request: HttpRequest) -> HttpResponse:
        """Issue a token through `token_issue`; the plaintext is on the response page only."""
        if not self.has_add_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        form = TokenIssueForm(request.POST or None)
        context = {**ops_page_context(self, request, "Issue an API token"), "form": form}
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            days = data.get("expires_in_days")
            try:
                token, secret = services.token_issue(
                    tenant_id=data["tenant"] or None,
                    role=data["role"],
                    name=data["name"],
                    expires_in_seconds=days * 86400 if days else None,
                    actor=admin_actor(request),
                    scope_pool_id=data["scope_pool"],
                    scope_node_id=data["scope_node"],
                )
            except DomainError as exc:
                form.add_error(None, str(exc))
            else:
                reach = _agent_reach(data) if data["role"] == Role.NODE_AGENT else ""
                context.update({"title": "Token issued", "token": token, "secret": secret, "reach": reach})
                response = TemplateResponse(request, "admin/core/apitoken/issued.html", context)
                # The secret must not linger in any cache.
                response["Cache-Control"] = "no-store"
                return response
        return TemplateResponse(request, "admin/core/apitoken/issue.html", context)

    @admin.action(description="Revoke selected tokens")
    @reason_action(
        title="Revoke tokens",
        form_class=forms.Form,
        done=lambda n: f"Revoked {plural(n, 'token')}; they stop working at once.",
        warning="Clients using these tokens will get 401 on their next call.",
    )
    def revoke_tokens(self, request: HttpRequest, token: ApiToken, data: dict[str, Any]) -> bool:
        was_active = token.revoked_at is None
        services.token_revoke(token=token, actor=admin_actor(request))
        return was_active


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "subject_type", "subject_link", "reason")
    list_filter = ("action", "subject_type", ("at", admin.DateFieldListFilter))
    search_fields = ("subject_id", "actor", "reason", "action")
    date_hierarchy = "at"
    list_per_page = 100

    @admin.display(description="subject", ordering="subject_id")
    def subject_link(self, obj: AuditEvent) -> str:
        targets: dict[str, str] = {
            "node": "admin:inventory_node_change",
            "pool": "admin:inventory_pool_change",
            "reservation": "admin:reservations_reservation_change",
            "token": "admin:core_apitoken_change",
        }
        name = targets.get(obj.subject_type)
        if name:
            return format_html(
                '<a href="{}">{}</a>', reverse(name, args=[quote(obj.subject_id)]), obj.subject_id
            )
        return obj.subject_id


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


__all__: Sequence[str] = (
    "OptionalReasonForm",
    "ReadOnlyAdmin",
    "ReasonForm",
    "admin_actor",
    "copyable_id",
    "copyable_id_column",
    "count_column",
    "ops_page_context",
    "plural",
    "reason_action",
)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "pool_count", "created_at")
    search_fields = ("id", "name")
    readonly_fields = ("created_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        return super().get_queryset(request).annotate(n_pools=Count("owned_pools"))

    pool_count = count_column("n_pools", "pools owned")
