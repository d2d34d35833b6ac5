"""Credentials and the audit trail: the writes behind `issue_token`, the admin and node operations."""

from __future__ import annotations

import json
import re
import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Func

from core.auth_cache import auth_cache_forget
from core.authentication import TOKEN_PREFIX, token_digest
from core.clock import compute_now
from core.constants import NODE_ID_REGEX, POOL_ID_REGEX
from core.errors import InvalidInput
from core.models import ApiToken, AuditEvent, Principal, Role, RoleBinding, Tenant

# Roles that act on the platform's machines or on every tenant: bound to the
# platform, never to one tenant (a tenant-bound operator would be a surprise).
PLATFORM_ROLES = frozenset({Role.OPERATOR, Role.NODE_AGENT, Role.METRICS})
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
    scope_pool_id: str = "",
    scope_node_id: str = "",
) -> tuple[ApiToken, str]:
    """Create a token (and its principal and role binding); return the row and the plaintext, shown once.

    Only the digest is stored. Operator and node-agent tokens are bound to the
    platform (`tenant_id=None`); viewer and member tokens to one tenant. A
    node-agent token may be narrowed to the nodes of one pool (`scope_pool_id`)
    or to one node (`scope_node_id`); without either it reaches every node.
    The ids are checked for their form only: `core` does not read nodes, and a
    well-formed id of nothing narrows the token to nothing.
    """
    _binding_check(role=role, tenant_id=tenant_id)
    if expires_in_seconds is not None and expires_in_seconds <= 0:
        raise InvalidInput.field("expires", "must be positive")
    _node_scope_check(role=role, scope_pool_id=scope_pool_id, scope_node_id=scope_node_id)

    with transaction.atomic():
        if principal is None:
            scope = tenant_id or scope_pool_id or scope_node_id or "platform"
            principal = Principal.objects.create(name=name or f"{role}@{scope}")
        # A second identical binding is a no-op (the partial unique constraints
        # refuse a duplicate); a principal holding several scopes reaches their union.
        fields = {
            "role": role,
            "tenant_id": tenant_id,
            "scope_pool_id": scope_pool_id,
            "scope_node_id": scope_node_id,
        }
        if not RoleBinding.objects.filter(principal=principal, **fields).exists():
            RoleBinding.objects.create(principal=principal, **fields)
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
        data = {
            "role": role,
            "tenantId": tenant_id,
            "principalId": principal.pk,
            "scopePoolId": scope_pool_id or None,
            "scopeNodeId": scope_node_id or None,
        }
        audit_record(actor=actor, action="token.issue", subject_type="token", subject_id=token.pk, data=data)
    return token, secret


def _binding_check(*, role: str, tenant_id: str | None) -> None:
    """A known role, bound to the platform or to one existing tenant as the role wants."""
    if role not in Role.values:
        raise InvalidInput.field("role", f"must be one of {', '.join(Role.values)}")
    if role in PLATFORM_ROLES and tenant_id is not None:
        raise InvalidInput.field("tenant", f"a {role} token is bound to the platform, not to a tenant")
    if role in TENANT_ROLES and tenant_id is None:
        raise InvalidInput.field("tenant", f"a {role} token needs a tenant")
    if tenant_id is not None and not Tenant.objects.filter(pk=tenant_id).exists():
        raise InvalidInput.field("tenant", f"unknown tenant {tenant_id!r}")


def _node_scope_check(*, role: str, scope_pool_id: str, scope_node_id: str) -> None:
    """A scope narrows a node agent only, names one pool or one node, and has that id's form."""
    if not (scope_pool_id or scope_node_id):
        return
    field = "pool" if scope_pool_id else "node"
    if role != Role.NODE_AGENT:
        raise InvalidInput.field(
            field, f"only a node-agent token is narrowed to a {field}, not a {role} token"
        )
    if scope_pool_id and scope_node_id:
        raise InvalidInput.field("node", "a node-agent token is narrowed to a pool or to a node, not both")
    pattern = POOL_ID_REGEX if scope_pool_id else NODE_ID_REGEX
    # `fullmatch`: the whole value, so a trailing newline (which `$` lets through) is refused too.
    if not re.fullmatch(pattern, scope_pool_id or scope_node_id):
        raise InvalidInput.field(field, f"is not a {field} id ({field}_…)")


def token_revoke(*, token: ApiToken, actor: str = "system") -> None:
    """Revoke a token at once; revoking twice keeps the first revocation time."""
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=Func(function="compute_now")
        )
        if updated:
            audit_record(actor=actor, action="token.revoke", subject_type="token", subject_id=token.pk)
    # The other processes forget it when the trigger's NOTIFY arrives; this one at once.
    auth_cache_forget()
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


def audit_sql(*, source: str, action: str, subject_type: str) -> str:
    """The INSERT of one audit event per `id` of `source`, for a CTE of the statement that makes the change.

    As `audit_record`, in the caller's transaction, but costing no statement of
    its own. Takes `%(audit_actor)s`, `%(audit_reason)s` and `%(audit_data)s`
    (`audit_params()`).
    """
    for value in (action, subject_type):
        if not value.replace(".", "").replace("_", "").isalnum():
            raise ValueError(f"not an audit name: {value!r}")
    return (
        "INSERT INTO core_auditevent (at, actor, action, subject_type, subject_id, reason, data)"
        f" SELECT compute_now(), %(audit_actor)s, '{action}', '{subject_type}', id, %(audit_reason)s,"
        f" %(audit_data)s::jsonb FROM {source} RETURNING id"
    )


def audit_params(*, actor: str, reason: str = "", data: dict[str, Any] | None = None) -> dict[str, str]:
    """The parameters `audit_sql` takes."""
    return {"audit_actor": actor, "audit_reason": reason, "audit_data": json.dumps(data or {})}


def tenants_upsert(*, names: dict[str, str]) -> None:
    """Create the tenants `{id: name}` or update their names, in one statement."""
    Tenant.objects.bulk_create(
        [Tenant(id=tenant_id, name=name) for tenant_id, name in names.items()],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["name"],
    )
