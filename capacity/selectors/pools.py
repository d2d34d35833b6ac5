"""Capacity reads: rollup rows in the contract's shape, the tenant summary, and at-risk reservations.

The rollup reads only read `pool_capacity_rollup` (never devices or bookings),
in a fixed number of queries whatever the number of pools. The at-risk reads
count and list the live reservations BookingRepair marked (`reservations.lifecycle.repair`),
through the partial index `reservation_at_risk`.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Func, QuerySet
from django.db.models.expressions import RawSQL

from inventory.choices import CLASS_SHARING, GPU_ATOM_CLASSES
from ledger.access import visible_pools
from reservations.models import ROLLUP_COUNTS, PoolCapacityRollup, Reservation
from reservations.rollups.counts import FRAGMENTATION_KEY

OTHER_GPU_MODEL = "other"
# What `byGpuModel` adds up, from each pool's `gpu` row only.
SUMMED_FIELDS = ("total", "allocatable", "allocated", "reserved", "available")


# The columns a row is made of, read as plain values: building model instances
# (and parsing `updated_at` into a datetime, only to turn it back into
# milliseconds) costs more than the query on the summary's hundred rows.
_ROW_FIELDS = ("pool_id", "resource", *ROLLUP_COUNTS)
_ROW_KEYS = ("poolId", "resource", *ROLLUP_COUNTS, "updatedAt")
# Milliseconds since the epoch, computed by the database (as `to_millis` would).
_UPDATED_MS = RawSQL("floor(extract(epoch FROM pool_capacity_rollup.updated_at) * 1000)::bigint", ())


def _rows(queryset: QuerySet[PoolCapacityRollup]) -> list[dict[str, Any]]:
    values = queryset.annotate(updated_ms=_UPDATED_MS).values_list(*_ROW_FIELDS, "updated_ms")
    return [dict(zip(_ROW_KEYS, row, strict=True)) for row in values]


def rollup_rows(*, pool_id: str) -> list[dict[str, Any]]:
    """One pool's rollup rows, ordered by resource name (one query; visibility is the caller's)."""
    return _rows(PoolCapacityRollup.objects.filter(pool_id=pool_id).order_by("resource"))


def capacity_summary(*, tenant_id: str) -> dict[str, Any]:
    """Every pool the tenant can see with its rows, plus whole-GPU totals per GPU model (two queries)."""
    pools = list(visible_pools(tenant_id=tenant_id).order_by("name", "id"))
    rows_by_pool: dict[str, list[dict[str, Any]]] = {pool.id: [] for pool in pools}
    rollups = PoolCapacityRollup.objects.filter(pool_id__in=list(rows_by_pool)).order_by(
        "pool_id", "resource"
    )
    for row in _rows(rollups):
        rows_by_pool[row["poolId"]].append(row)

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


def _at_risk(queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
    """Live reservations marked at risk (a mark left on an ended one until the next repair run is not)."""
    now = Func(function="compute_now", output_field=DateTimeField())
    return queryset.filter(at_risk_since__isnull=False, state__in=("scheduled", "active"), ends_at__gt=now)


def pool_at_risk_count(*, pool_id: str) -> int:
    """How many live reservations of the pool are at risk, every tenant's (a count, never ids)."""
    return _at_risk(Reservation.objects.filter(pool_id=pool_id)).count()


# The pool's rows and its at-risk count in one statement. The count rides as an
# uncorrelated subquery (computed once, through `reservation_at_risk`) and is
# also returned when the pool has no rows yet. Written out rather than built
# through the ORM: the statement runs in 0.6 ms, the queryset that made it took
# 3 ms of Python to compile on every call.
_POOL_CAPACITY_SQL = f"""
WITH at_risk AS (
    SELECT count(*) AS c FROM reservations_reservation
     WHERE pool_id = %(pool)s AND at_risk_since IS NOT NULL
       AND state IN ('scheduled', 'active') AND ends_at > compute_now()
)
SELECT {", ".join(f"r.{name}" for name in _ROW_FIELDS)},
       floor(extract(epoch FROM r.updated_at) * 1000)::bigint, a.c
  FROM at_risk a LEFT JOIN pool_capacity_rollup r ON r.pool_id = %(pool)s
 ORDER BY r.resource
"""


def pool_capacity(*, pool_id: str) -> dict[str, Any]:
    """`capacity/byPool`'s answer: the pool's rollup rows and its at-risk count, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(_POOL_CAPACITY_SQL, {"pool": pool_id})
        fetched = cursor.fetchall()
    rows = [dict(zip(_ROW_KEYS, values, strict=True)) for *values, _ in fetched if values[0] is not None]
    return {"poolId": pool_id, "rows": rows, "atRiskReservations": int(fetched[0][-1])}


# One row per value of the label, from `pool_fabric_counts`, which PostgreSQL
# keeps from the per-node counts the placer reads (`node_atom_counts`,
# migration 0017): the read costs what the answer holds, not what the pool
# holds. "Now" is as far as the worker has moved the bookings' phases (seconds
# behind the clock at most); a booking, a cordon or a health change shows in
# the statement that makes it.
_FRAGMENTATION_SQL = """
SELECT fabric, nodes, nodes_free, whole_free, stranded
  FROM pool_fabric_counts
 WHERE pool_id = %(pool)s AND device_class = %(class)s AND nodes > 0
 ORDER BY fabric
"""


def pool_gpu_class(sharing: str) -> str:
    """The GPU atom class a pool of this sharing mode hands out (`gpu`, `gpu.mig` or `gpu.slot`)."""
    return next(name for name in GPU_ATOM_CLASSES if sharing in CLASS_SHARING[name])


def pool_fragmentation(*, pool_id: str, sharing: str) -> dict[str, Any]:
    """How fragmented the pool is now, per fabric: free nodes, the whole-node gang that fits, stranded atoms.

    Per value of the node label `fabric` (`""` for nodes without it), over the
    schedulable nodes with healthy atoms of the pool's GPU class: `nodes`;
    `nodesFree`, those with none of them booked now; `wholeNodeGang`, those of
    them with at least eight whole GPUs, the largest gang of whole 8-GPU nodes
    that would fit now on that fabric (in a MIG or time-slice pool, where the
    atoms are parts of GPUs, every free node: a whole-node lease takes it all);
    `strandedAtoms`, the free atoms on partly booked nodes, which no
    whole-node request can use.
    """
    device_class = pool_gpu_class(sharing)
    with connection.cursor() as cursor:
        cursor.execute(_FRAGMENTATION_SQL, {"pool": pool_id, "class": device_class})
        groups = [
            {
                "value": value,
                "nodes": int(nodes),
                "nodesFree": int(nodes_free),
                "wholeNodeGang": int(whole_free),
                "strandedAtoms": int(stranded),
            }
            for value, nodes, nodes_free, whole_free, stranded in cursor.fetchall()
        ]
    return {"topologyKey": FRAGMENTATION_KEY, "deviceClass": device_class, "groups": groups}


def at_risk_reservations(
    *, pool_id: str | None = None, node_id: str | None = None, limit: int = 100
) -> list[Reservation]:
    """The pool's (or the node's) live at-risk reservations, longest at risk first, for the operators."""
    queryset = Reservation.objects.all()
    if pool_id is not None:
        queryset = queryset.filter(pool_id=pool_id)
    if node_id is not None:
        queryset = queryset.filter(
            pk__in=Reservation.objects.filter(allocations__node_id=node_id).values("pk")
        )
    return list(_at_risk(queryset).order_by("at_risk_since", "id")[:limit])
