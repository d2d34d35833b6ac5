"""Withdrawing an offering: refused while the tenant holds live reservations in the pool.

It lives here, above the ledger, because it reads the reservations. The
offering and its quota rows go together, audited with the actor.
"""

from __future__ import annotations

from django.db import transaction

from core.errors import Conflict
from core.services import audit_record
from inventory.models import Pool
from inventory.services.pools import pool_mark_api_changed
from inventory.services.registration import offering_remove
from ledger.offerings import offering_find
from ledger.quota import quota_rows_lock, quota_rows_remove
from reservations.models import Reservation


def offering_withdraw(*, pool: Pool, tenant_id: str, actor: str) -> None:
    """Take the pool's offer to the tenant back, with its limits; CONFLICT while it holds live reservations.

    Live: scheduled or active. Their tenant could no longer see the pool, nor
    its quota give anything back to; it releases them first (or they end).
    The tenant's quota rows are locked first, as a create's charge locks them,
    so a create that charged before commits before the count, and one that
    charges after finds no row.
    """
    with transaction.atomic():
        offering_find(pool_id=pool.pk, tenant_id=tenant_id)
        quota_rows_lock(pool_id=pool.pk, tenant_id=tenant_id)
        live = Reservation.objects.filter(pool=pool, tenant_id=tenant_id, state__in=["scheduled", "active"])
        count = live.count()
        if count:
            raise Conflict(
                f"{tenant_id} holds {count} live reservations in this pool; they must be released"
                " (or end) before the offering is withdrawn",
                [{"field": "tenantId", "message": f"{count} live reservations", "liveReservations": count}],
            )
        quota_rows_remove(pool_id=pool.pk, tenant_id=tenant_id)
        offering_remove(pool_id=pool.pk, tenant_id=tenant_id)
        pool_mark_api_changed(pool_id=pool.pk)
        audit_record(
            actor=actor,
            action="offering.withdraw",
            subject_type="pool",
            subject_id=pool.pk,
            data={"tenant": tenant_id},
        )
