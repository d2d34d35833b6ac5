"""Credentials and the audit trail: the writes behind `issue_token`, the admin and node operations."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Func

from core.authentication import TOKEN_PREFIX, token_digest
from core.clock import compute_now
from core.errors import InvalidInput
from core.models import ApiToken, AuditEvent, Principal, Role, RoleBinding, Tenant

# Roles that act on the platform's machines or on every tenant: bound to the
# platform, never to one tenant (a tenant-bound operator would be a surprise).
PLATFORM_ROLES = frozenset({Role.OPERATOR, Role.NODE_AGENT})
# Roles that only make sense inside one tenant.
TENANT_ROLES = frozenset({Role.VIEWER, Role.MEMBER})

# The part of a token kept in clear, so an operator can tell tokens apart in the admin.
DISPLAY_PREFIX_LENGTH = 10


def _new_secret() -> str:
    # 32 random bytes: guessing is hopeless, so a plain SHA-256 (no salt, no
    # slow hash) is enough and keeps the lookup a single unique-index probe.
    return f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}"


def token_issue(
    *,
    tenant_id: str | None,
    role: str,
    name: str = "",
    expires_in_seconds: int | None = None,
    principal: Principal | None = None,
    actor: str = "system",
) -> tuple[ApiToken, str]:
    """Create a token (and its principal and role binding); return the row and the plaintext, shown once.

    Only the digest is stored. Operator and node-agent tokens are bound to the
    platform (`tenant_id=None`); viewer and member tokens to one tenant.
    """
    if role not in Role.values:
        raise InvalidInput.field("role", f"must be one of {', '.join(Role.values)}")
    if role in PLATFORM_ROLES and tenant_id is not None:
        raise InvalidInput.field("tenant", f"a {role} token is bound to the platform, not to a tenant")
    if role in TENANT_ROLES and tenant_id is None:
        raise InvalidInput.field("tenant", f"a {role} token needs a tenant")
    if tenant_id is not None and not Tenant.objects.filter(pk=tenant_id).exists():
        raise InvalidInput.field("tenant", f"unknown tenant {tenant_id!r}")
    if expires_in_seconds is not None and expires_in_seconds <= 0:
        raise InvalidInput.field("expires", "must be positive")

    with transaction.atomic():
        if principal is None:
            scope = tenant_id or "platform"
            principal = Principal.objects.create(name=name or f"{role}@{scope}")
        # The partial unique constraints make a second identical binding a no-op.
        binding = RoleBinding.objects.filter(principal=principal, role=role, tenant_id=tenant_id)
        if not binding.exists():
            RoleBinding.objects.create(principal=principal, role=role, tenant_id=tenant_id)
        expires_at = None
        if expires_in_seconds is not None:
            # The database's clock, like every expiry check in authentication.
            expires_at = compute_now() + timedelta(seconds=expires_in_seconds)
        secret = _new_secret()
        token = ApiToken.objects.create(
            principal=principal,
            name=name,
            prefix=secret[:DISPLAY_PREFIX_LENGTH],
            digest=token_digest(secret),
            expires_at=expires_at,
        )
        audit_record(
            actor=actor,
            action="token.issue",
            subject_type="token",
            subject_id=token.pk,
            data={"role": role, "tenantId": tenant_id, "principalId": principal.pk},
        )
    return token, secret


def token_revoke(*, token: ApiToken, actor: str = "system") -> None:
    """Revoke a token at once; revoking twice keeps the first revocation time."""
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=Func(function="compute_now")
        )
        if updated:
            audit_record(actor=actor, action="token.revoke", subject_type="token", subject_id=token.pk)
    token.refresh_from_db(fields=["revoked_at"])


def audit_record(
    *,
    actor: str,
    action: str,
    subject_type: str,
    subject_id: str,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event, inside the caller's transaction so it commits with the change."""
    return AuditEvent.objects.create(
        actor=actor,
        action=action,
        subject_type=subject_type,
        subject_id=str(subject_id),
        reason=reason,
        data=data or {},
    )


def tenants_upsert(*, names: dict[str, str]) -> None:
    """Create the tenants `{id: name}` or update their names, in one statement."""
    Tenant.objects.bulk_create(
        [Tenant(id=tenant_id, name=name) for tenant_id, name in names.items()],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["name"],
    )
