"""Bearer-token authentication: `Authorization: Bearer <token>`."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import Any

from django.db.models import DateTimeField, Func, Q, Value
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.errors import Unauthenticated
from core.models import ApiToken, Principal

LAST_USED_RESOLUTION = timedelta(minutes=1)
TOKEN_PREFIX = "bc_"  # noqa: S105 (a public prefix, not a secret)


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
        # Unknown, revoked and expired tokens look the same to the caller.
        row = (
            ApiToken.objects.select_related("principal")
            .filter(digest=digest, revoked_at__isnull=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Func(function="compute_now")))
            .first()
        )
        if row is None or not hmac.compare_digest(row.digest, digest):
            raise Unauthenticated("a valid bearer token is required")
        # At most one write per token per minute, and a guarded one: a busy
        # client does not turn every read into a row update.
        now = Func(function="compute_now", output_field=DateTimeField())
        stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - Value(LAST_USED_RESOLUTION))
        ApiToken.objects.filter(stale, pk=row.pk).update(last_used_at=now)
        return row.principal, row

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
