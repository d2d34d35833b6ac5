"""Bearer-token authentication: `Authorization: Bearer <token>`."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from django.db.models import Func, Q
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.errors import Unauthenticated
from core.models import ApiToken, Principal

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
