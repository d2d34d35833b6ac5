"""Decisions on a pool: which pools a tenant sees, and "decided on the pool".

"Decided on the pool" is "decided on the tenant" (`core.decisions`) plus that
the pool is owned by or offered to the tenant, else NOT_FOUND; archived pools
are visible to their owner only.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet

from core.decisions import decide_tenant
from core.errors import NotFound
from core.models import Principal
from inventory.models import Pool
from ledger.models import Offering


def visible_pools(*, tenant_id: str) -> QuerySet[Pool]:
    """Pools the tenant owns (archived included), or is offered and are not archived."""
    offered = Exists(Offering.objects.filter(pool=OuterRef("pk"), tenant_id=tenant_id))
    return Pool.objects.filter(Q(owner_id=tenant_id) | (offered & Q(archived_at__isnull=True)))


def decide_pool(*, principal: Principal, tenant_id: str, pool_id: str, permission: str) -> Pool:
    """Decide on the tenant, then return the pool if the tenant can see it (else NOT_FOUND).

    The tenant decision comes first, so a caller without rights on the tenant
    learns nothing about which pools exist (403 before any 404).
    """
    decide_tenant(principal=principal, tenant_id=tenant_id, permission=permission)
    pool = visible_pools(tenant_id=tenant_id).filter(pk=pool_id).first()
    if pool is None:
        raise NotFound("pool not found")
    return pool
