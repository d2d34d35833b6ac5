"""Decisions on a pool: which pools a tenant sees, and "decided on the pool".

"Decided on the pool" is "decided on the tenant" (`core.decisions`) plus that
the pool is owned by or offered to the tenant, else NOT_FOUND; archived pools
are visible to their owner only.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from core.decisions import decide_tenant
from core.errors import NotFound
from core.models import Principal
from core.ratelimit import WriteCount
from core.rows import model_columns, model_from_row
from inventory.models import Pool
from ledger.models import Offering


def visible_pools(*, tenant_id: str) -> QuerySet[Pool]:
    """Pools the tenant owns (archived included), or is offered and are not archived."""
    offered = Exists(Offering.objects.filter(pool=OuterRef("pk"), tenant_id=tenant_id))
    return Pool.objects.filter(Q(owner_id=tenant_id) | (offered & Q(archived_at__isnull=True)))


# `visible_pools` for one pool, as a join condition on `p`.
_VISIBLE = (
    "p.id = %(pool)s AND (p.owner_id = %(tenant)s OR (p.archived_at IS NULL AND EXISTS ("
    f"SELECT 1 FROM {Offering._meta.db_table} o WHERE o.pool_id = p.id AND o.tenant_id = %(tenant)s)))"
)


def decide_pool(
    *, principal: Principal, tenant_id: str, pool_id: str, permission: str, rate: WriteCount | None = None
) -> Pool:
    """Decide on the tenant, then return the pool if the tenant can see it (else NOT_FOUND).

    The tenant decision comes first, so a caller without rights on the tenant
    learns nothing about which pools exist (403 before any 404). A write's
    `rate` is counted in the same statement (`WriteCount.take`), one round
    trip instead of two; the caller refuses past the limit once its own
    checks are done (`WriteCount.check_taken`).
    """
    decide_tenant(principal=principal, tenant_id=tenant_id, permission=permission)
    # `visible_pools` as one plain query (every create and preview asks it: no queryset built).
    params: dict[str, Any] = {"pool": pool_id, "tenant": tenant_id}
    with connection.cursor() as cursor:
        if rate is None:
            columns = model_columns(Pool, "p")
            cursor.execute(f"SELECT {columns} FROM inventory_pool p WHERE {_VISIBLE}", params)
            row = cursor.fetchone()
        else:
            # The count's row comes back whether the pool is visible or not (the LEFT JOIN).
            cte = rate.cte_for_connection()
            cursor.execute(
                f"WITH {cte} SELECT {rate.column}, {model_columns(Pool, 'p')}"
                f" FROM (SELECT) AS one LEFT JOIN inventory_pool p ON {_VISIBLE}",
                params | rate.params(),
            )
            counted, *pool_row = cursor.fetchone()
            rate.take(counted)
            row = None if pool_row[0] is None else tuple(pool_row)
    if row is None:
        raise NotFound("pool not found")
    return model_from_row(Pool, row)
