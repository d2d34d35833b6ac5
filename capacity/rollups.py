"""Pool capacity rollups: deltas in the booking transaction, and the rebuild.

Reading capacity never aggregates devices; it reads these rows. The booking
transaction applies deltas (`rollup_apply_delta`), and the reconciler's
rebuild recounts from nodes, devices, bookings and node resources.
"""

from __future__ import annotations

from django.db import connection

ATOM_RESOURCES = ("gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node")
SCALAR_RESOURCES = ("vcpu", "memoryGiB", "diskGiB", "hugepages1Gi")


def rollup_apply_delta(*, pool_id: str, resource: str, allocated: int = 0, reserved: int = 0) -> None:
    """Add a placement's (or subtract a release's) atoms, inside the caller's transaction.

    `allocated` counts bookings that have started, `reserved` those that start
    later. Counts never go below zero: a booking that started after the last
    rebuild sits in `reserved` until the next one, and its release may subtract
    from `allocated`; the rebuild corrects that drift.
    """
    if not allocated and not reserved:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pool_capacity_rollup (pool_id, resource, total, allocatable, allocated,
                reserved, provisioning, unhealthy, maintenance, unreachable, updated_at)
            VALUES (%(pool)s, %(resource)s, 0, 0, GREATEST(0, %(allocated)s), GREATEST(0, %(reserved)s),
                0, 0, 0, 0, compute_now())
            ON CONFLICT (pool_id, resource) DO UPDATE
               SET allocated = GREATEST(0, pool_capacity_rollup.allocated + %(allocated)s),
                   reserved = GREATEST(0, pool_capacity_rollup.reserved + %(reserved)s),
                   updated_at = compute_now()
            """,
            {"pool": pool_id, "resource": resource, "allocated": allocated, "reserved": reserved},
        )
