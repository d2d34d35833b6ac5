"""Bearer-token authentication: `Authorization: Bearer <token>`."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Func, Q, Value
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.auth_cache import MEMORY
from core.decisions import principal_bindings_set
from core.errors import Unauthenticated
from core.models import ApiToken, Principal

LAST_USED_RESOLUTION = timedelta(minutes=1)
TOKEN_PREFIX = "bc_"  # noqa: S105 (a public prefix, not a secret)


# Served by the unique index on `core_apitoken.digest`; the bindings by the
# index of their `principal` foreign key. Each binding comes as [role, tenant,
# scope pool, scope node] (`core.decisions.Binding`). `stale` says whether
# `last_used_at` is older than the resolution, computed by the database clock;
# `cacheable` whether the token outlives the process's memory of it (`core.auth_cache`).
_AUTH_SQL = """
SELECT t.id, t.digest, p.id, p.name,
       (t.last_used_at IS NULL OR t.last_used_at < compute_now() - make_interval(secs => %s)) AS stale,
       (SELECT array_agg(ARRAY[b.role, b.tenant_id, b.scope_pool_id, b.scope_node_id])
          FROM core_rolebinding b WHERE b.principal_id = p.id),
       (t.expires_at IS NULL OR t.expires_at > compute_now() + make_interval(secs => %s)) AS cacheable
  FROM core_apitoken t
  JOIN core_principal p ON p.id = t.principal_id
 WHERE t.digest = %s AND t.revoked_at IS NULL
   AND (t.expires_at IS NULL OR t.expires_at > compute_now())
"""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Principal, ApiToken] | None:
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].decode(errors="replace") != self.keyword or len(header) != 2:
            raise Unauthenticated("a valid bearer token is required")
        try:
            token = header[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise Unauthenticated("a valid bearer token is required") from exc
        digest = token_digest(token)
        row = MEMORY.get(digest)
        remembered = row is not None
        if row is None:
            # One round trip for the whole signed-in path: the token (unknown,
            # revoked and expired look the same to the caller), its principal,
            # every role binding of that principal (the decisions of this request
            # read them from memory), and whether `last_used_at` is due a write.
            generation = MEMORY.generation
            with connection.cursor() as cursor:
                cursor.execute(
                    _AUTH_SQL, [LAST_USED_RESOLUTION.total_seconds(), 2 * MEMORY.seconds(), digest]
                )
                row = cursor.fetchone()
            if row is not None and row[6]:
                MEMORY.put(digest, row, generation=generation)
        if row is None or not hmac.compare_digest(row[1], digest):
            raise Unauthenticated("a valid bearer token is required")
        token_id, _digest, principal_id, principal_name, stale, bindings, _cacheable = row
        if stale and not remembered:
            # At most one write per token per minute, and a guarded one: the
            # WHERE clause is re-checked under the row lock, so two requests
            # that both saw a stale value write once. The common case (used
            # within the last minute) costs no statement at all.
            now = Func(function="compute_now", output_field=DateTimeField())
            due = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - Value(LAST_USED_RESOLUTION))
            ApiToken.objects.filter(due, pk=token_id).update(last_used_at=now)
        principal = Principal(id=principal_id, name=principal_name)
        # Only for this request: a binding revoked between requests is seen by the next one.
        principal_bindings_set(principal, bindings or [])
        return principal, ApiToken(id=token_id, principal_id=principal_id, digest=digest)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def principal_of(request: Any) -> Principal:
    principal: Principal = request.user
    return principal


class PrincipalRequired(BasePermission):
    """Any authenticated principal; what it may do is decided per method (`core.decisions`).

    DRF's `IsAuthenticated` expects a Django user; a `Principal` is not one.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, Principal)


def actor_of(request: Any) -> str:
    """Who the audit trail and release reasons name for an API call: the principal's name and id."""
    principal = principal_of(request)
    return f"{principal.name} <{principal.pk}>"[:200]
