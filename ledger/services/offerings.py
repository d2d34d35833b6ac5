"""Offerings with their quotas, as operators manage them (`offerings/*`) and fleet files declare them.

The offering row and its quota rows (`ledger.services.quota`) are both this app's; a
change of either goes through here, audited with its actor. Withdrawing is
refused while the tenant holds live reservations, which the caller counts
(`reservations.selectors.reservations_live_count`): the ledger sits below them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from core.errors import Conflict, InvalidInput
from core.models import Tenant
from core.services import audit_record
from inventory.models import Pool
from inventory.services.pools import pool_audit, pool_mark_api_changed
from ledger.models import Offering
from ledger.selectors import offering_find, offering_limits
from ledger.services.quota import quota_limits_apply, quota_rows_lock, quota_rows_remove


def offering_create(
    *,
    pool: Pool,
    tenant_id: str,
    quota: dict[str, int],
    mode: str | None,
    actor: str,
    via_api: bool = True,
) -> Offering:
    """Offer the pool to a tenant with these limits; CONFLICT when it already is offered."""
    if tenant_id == pool.owner_id:
        raise InvalidInput.field("tenantId", "a pool is not offered to its owner")
    if not Tenant.objects.filter(pk=tenant_id).exists():
        raise InvalidInput.field("tenantId", f"unknown tenant {tenant_id}")
    if not offering_ensure(pool_id=pool.pk, tenant_id=tenant_id):
        raise Conflict(f"the pool is already offered to {tenant_id}; change it with offerings/update")
    quota_limits_apply(
        pool_id=pool.pk, tenant_id=tenant_id, limits=dict(quota), mode=mode, refuse_below_use=via_api
    )
    _changed(pool, "offering.create", actor=actor, via_api=via_api, tenant=tenant_id, quota=quota, mode=mode)
    return offering_find(pool_id=pool.pk, tenant_id=tenant_id)


def offering_update(
    *,
    pool: Pool,
    tenant_id: str,
    quota: dict[str, int | None],
    mode: str | None,
    actor: str,
    via_api: bool = True,
) -> Offering:
    """Change an offering's limits (None removes one) and, when given, the mode of all its rows.

    Through the API a counter limit below what the tenant holds is refused
    (CONFLICT, nothing changed); a fleet reload raises it to the use instead,
    so a reload never fails while workloads run (`ledger.services.quota.quota_limits_apply`).
    Only what changes is audited.
    """
    offering = offering_find(pool_id=pool.pk, tenant_id=tenant_id)
    before = offering_limits(pool.pk, tenant_id)
    quota_limits_apply(
        pool_id=pool.pk, tenant_id=tenant_id, limits=dict(quota), mode=mode, refuse_below_use=via_api
    )
    after = offering_limits(pool.pk, tenant_id)
    if after == before:
        return offering
    _changed(
        pool, "offering.update", actor=actor, via_api=via_api, tenant=tenant_id, before=before, after=after
    )
    return offering


def offering_declare(
    *, pool: Pool, tenant_id: str, quota: dict[str, int], mode: str | None, actor: str
) -> None:
    """A fleet file's offer: create it, or bring its named limits (and mode, if given) to the file's."""
    if Offering.objects.filter(pool_id=pool.pk, tenant_id=tenant_id).exists():
        offering_update(
            pool=pool, tenant_id=tenant_id, quota=dict(quota), mode=mode, actor=actor, via_api=False
        )
    else:
        offering_create(pool=pool, tenant_id=tenant_id, quota=quota, mode=mode, actor=actor, via_api=False)


def _changed(pool: Pool, action: str, *, actor: str, via_api: bool, **data: Any) -> None:
    """Audit an offering's change; one made through the API stamps the pool too (fleet files leave it be)."""
    if via_api:
        pool_mark_api_changed(pool_id=pool.pk)
    pool_audit(pool.pk, action, actor=actor, via_api=via_api, **data)


def offering_ensure(*, pool_id: str, tenant_id: str) -> bool:
    """Offer the pool to the tenant (once); whether it was offered now."""
    _, created = Offering.objects.get_or_create(pool_id=pool_id, tenant_id=tenant_id)
    return created


def offering_remove(*, pool_id: str, tenant_id: str) -> bool:
    """Take the offer back; whether there was one. The caller checks what may not be left behind."""
    deleted, _ = Offering.objects.filter(pool_id=pool_id, tenant_id=tenant_id).delete()
    return deleted > 0


def offering_withdraw(
    *, pool: Pool, tenant_id: str, actor: str, live_reservations: Callable[[], int]
) -> None:
    """Take the pool's offer to the tenant back, with its limits; CONFLICT while it holds live reservations.

    Live: scheduled or active. Their tenant could no longer see the pool, nor
    its quota give anything back to; it releases them first (or they end).
    `live_reservations` counts them (the reservations sit above the ledger, so
    the caller hands the count in, as a create hands its charge the peaks).
    The tenant's quota rows are locked first, as a create's charge locks them,
    so a create that charged before commits before the count, and one that
    charges after finds no row.
    """
    with transaction.atomic():
        offering_find(pool_id=pool.pk, tenant_id=tenant_id)
        quota_rows_lock(pool_id=pool.pk, tenant_id=tenant_id)
        count = live_reservations()
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
