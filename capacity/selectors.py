"""Capacity reads: rollup rows in the contract's shape, and the tenant summary.

These only read `pool_capacity_rollup` (never devices or bookings), in a
fixed number of queries whatever the number of pools.
"""

from __future__ import annotations

from typing import Any

from capacity.models import PoolCapacityRollup
from core.clock import to_millis
from core.decisions import visible_pools

OTHER_GPU_MODEL = "other"
# What `byGpuModel` adds up, from each pool's `gpu` row only.
SUMMED_FIELDS = ("total", "allocatable", "allocated", "reserved", "available")


def _row(rollup: PoolCapacityRollup) -> dict[str, Any]:
    return {
        "poolId": rollup.pool_id,
        "resource": rollup.resource,
        "total": rollup.total,
        "allocatable": rollup.allocatable,
        "allocated": rollup.allocated,
        "reserved": rollup.reserved,
        "available": rollup.available,
        "provisioning": rollup.provisioning,
        "unhealthy": rollup.unhealthy,
        "maintenance": rollup.maintenance,
        "unreachable": rollup.unreachable,
        "updatedAt": to_millis(rollup.updated_at),
    }


def rollup_rows(*, pool_id: str) -> list[dict[str, Any]]:
    """One pool's rollup rows, ordered by resource name (one query; visibility is the caller's)."""
    return [_row(r) for r in PoolCapacityRollup.objects.filter(pool_id=pool_id).order_by("resource")]


def capacity_summary(*, tenant_id: str) -> dict[str, Any]:
    """Every pool the tenant can see with its rows, plus whole-GPU totals per GPU model (two queries)."""
    pools = list(visible_pools(tenant_id=tenant_id).order_by("name", "id"))
    rows_by_pool: dict[str, list[dict[str, Any]]] = {pool.id: [] for pool in pools}
    rollups = PoolCapacityRollup.objects.filter(pool_id__in=list(rows_by_pool)).order_by(
        "pool_id", "resource"
    )
    for rollup in rollups:
        rows_by_pool[rollup.pool_id].append(_row(rollup))

    by_model: dict[str, dict[str, int]] = {}
    out_pools = []
    for pool in pools:
        rows = rows_by_pool[pool.id]
        model = pool.gpu_model or OTHER_GPU_MODEL
        sums = by_model.setdefault(model, dict.fromkeys(SUMMED_FIELDS, 0))
        for row in rows:
            if row["resource"] == "gpu":
                for name in SUMMED_FIELDS:
                    sums[name] += row[name]
        out_pools.append(
            {
                "poolId": pool.id,
                "name": pool.name,
                "ownerTenantId": pool.owner_id,
                "offered": pool.owner_id != tenant_id,
                "archived": pool.archived_at is not None,
                "gpuModel": pool.gpu_model or None,
                "sharing": pool.sharing,
                "capacity": rows,
            }
        )
    return {"tenantId": tenant_id, "pools": out_pools, "byGpuModel": dict(sorted(by_model.items()))}
