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


class Principal(models.Model):
    """Who calls the API: a person, a tool or a node agent."""

    id = models.CharField(primary_key=True, max_length=64, default=ids.id_default(ids.PRINCIPAL))
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class RoleBinding(models.Model):
    """A role on one tenant, or on the platform when `tenant` is empty."""

    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="bindings")
    role = models.CharField(max_length=20, choices=Role.choices)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["principal", "role", "tenant"],
                name="rolebinding_unique_tenant",
                condition=Q(tenant__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["principal", "role"],
                name="rolebinding_unique_platform",
                condition=Q(tenant__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        scope = self.tenant_id or "platform"
        return f"{self.principal_id} {self.role}@{scope}"


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
