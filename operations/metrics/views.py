"""`GET /metrics`: open to a peer in `METRICS_ALLOWED_NETS` or a bearer token of the `metrics` role."""

from __future__ import annotations

import ipaddress
from functools import cache
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from core.authentication import BearerTokenAuthentication
from core.decisions import METRICS_READ, has_permission
from core.errors import PermissionDenied, Unauthenticated
from core.models import Principal
from operations.metrics.process import process_exposition
from operations.metrics.scrape import database_families
from operations.metrics.text import CONTENT_TYPE, render

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@cache
def allowed_networks(nets: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(net.strip(), strict=False) for net in nets if net.strip())


def peer_allowed(address: str) -> bool:
    """Whether the TCP peer (never `X-Forwarded-For`, which any client can write) is in the allowed nets."""
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return any(peer in net for net in allowed_networks(tuple(settings.METRICS_ALLOWED_NETS)))


class ScrapeAllowed(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if isinstance(request.user, Principal):
            if has_permission(principal=request.user, permission=METRICS_READ, tenant_id=None):
                return True
            raise PermissionDenied("the credential does not grant the metrics scrape (a metrics token does)")
        if peer_allowed(request.META.get("REMOTE_ADDR", "")):
            return True
        raise Unauthenticated("a bearer token of the metrics role is required from this address")


class MetricsView(APIView):
    """Prometheus's scrape: the database's families read now, then this server's counters."""

    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [ScrapeAllowed]
    # Not a method of the compute API: no place in its document.
    schema = None

    def get(self, request: Request) -> HttpResponse:
        body = render(database_families()).encode() + process_exposition()
        return HttpResponse(body, content_type=CONTENT_TYPE)
