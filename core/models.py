"""Tenants, principals, role bindings, API tokens and the audit trail."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from core import ids
from core.constants import TENANT_ID_REGEX


class Tenant(models.Model):
    """Who owns pools and reservations: the unit of isolation every decision is made on."""

    id = models.CharField(primary_key=True, max_length=128, validators=[RegexValidator(TENANT_ID_REGEX)])
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The table keeps the name it was created with when tenants lived in `inventory`.
        db_table = "inventory_tenant"

    def __str__(self) -> str:
        return self.id


class Role(models.TextChoices):
    VIEWER = "viewer"
    MEMBER = "member"
    OPERATOR = "operator"
    NODE_AGENT = "node-agent"
    # Scrapes `GET /metrics` and nothing else (operations/metrics).
    METRICS = "metrics"


class Principal(models.Model):
    """Who calls the API: a person, a tool or a node agent."""

    id = models.CharField(primary_key=True, max_length=64, default=ids.id_default(ids.PRINCIPAL))
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class RoleBinding(models.Model):
    """A role on one tenant, or on the platform when `tenant` is empty.

    A platform node-agent binding may be narrowed to the nodes of one pool
    (`scope_pool_id`) or to one node (`scope_node_id`). They are plain ids, not
    foreign keys: `core` sits below `inventory` and never reads its tables; the
    view that finds the node (in `capacity`) checks it against the scope
    (`core.decisions.NodeScope`). Empty means no narrowing. A principal may
    hold several such bindings and reaches their union.
    """

    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="bindings")
    role = models.CharField(max_length=20, choices=Role.choices)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    scope_pool_id = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="Node agents only: the pool whose nodes it reports for.",
    )
    scope_node_id = models.CharField(
        max_length=64, blank=True, default="", help_text="Node agents only: the one node it reports for."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["principal", "role", "tenant"],
                name="rolebinding_unique_tenant",
                condition=Q(tenant__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["principal", "role", "scope_pool_id", "scope_node_id"],
                name="rolebinding_unique_platform",
                condition=Q(tenant__isnull=True),
            ),
            # A scope narrows a platform node agent, and is one pool or one node, never both.
            models.CheckConstraint(
                name="rolebinding_scope_node_agent_only",
                condition=Q(scope_pool_id="", scope_node_id="") | Q(role="node-agent", tenant__isnull=True),
            ),
            models.CheckConstraint(
                name="rolebinding_scope_one_kind",
                condition=Q(scope_pool_id="") | Q(scope_node_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.principal_id} {self.role}@{self.scope_label}"

    @property
    def scope_label(self) -> str:
        """`acme`, `platform`, or `platform (pool pool_…)` / `platform (node node_…)` for a narrowed agent."""
        scope = self.tenant_id or "platform"
        if self.scope_pool_id:
            return f"{scope} (pool {self.scope_pool_id})"
        if self.scope_node_id:
            return f"{scope} (node {self.scope_node_id})"
        return scope


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the secret is shown once."""

    id = models.CharField(primary_key=True, max_length=64, default=ids.id_default(ids.TOKEN))
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=200, blank=True)
    # The first characters of the token, so an operator can tell tokens apart.
    prefix = models.CharField(max_length=16)
    # Lookup is by this digest (unique index), then compared in constant time.
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or self.principal_id})"


class AuditEvent(models.Model):
    """Who did what to which record, when and why (operator actions and node ops)."""

    at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=64)
    subject_type = models.CharField(max_length=32)
    subject_id = models.CharField(max_length=255)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        # The node page and the admin list read a subject's trail newest first.
        indexes = [models.Index(fields=["subject_type", "subject_id", "-at"], name="audit_subject_at")]
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.subject_id}"


class RateWindow(models.Model):
    """How many writes one key (a token, a tenant) made in one window: the shared rate-limit counter.

    Every server process and replica counts in these rows (`core.ratelimit`),
    so a limit holds across them; old windows are pruned by the reconciler.
    """

    key = models.CharField(max_length=200)
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "window_start"], name="ratewindow_unique")]

    def __str__(self) -> str:
        return f"{self.key} @ {self.window_start:%H:%M}: {self.count}"


class WorkerJob(models.Model):
    """One of the worker's jobs: when it last ran, how long it took, and how it ended.

    `/healthz` and the admin's header read these rows to show the worker's lag.
    """

    name = models.CharField(primary_key=True, max_length=64)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    last_seconds = models.FloatField(default=0)
    last_error = models.TextField(blank=True)
    last_count = models.BigIntegerField(default=0)
    runs = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=128, blank=True)

    def __str__(self) -> str:
        return self.name
