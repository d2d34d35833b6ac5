"""The counts kept beside the bookings: per node (for the placer), per pool and fabric, per pool and resource.

`NodeAtomCount` and `PoolFabricCount` are kept by PostgreSQL's triggers
(migrations 0007 and 0017), `PoolCapacityRollup` by the writers' deltas and
the rebuild (`reservations.rollups`). `reservations.models` re-exports them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Func, Q, Value
from django.db.models.functions import Greatest


class NodeAtomCount(models.Model):
    """Per node and atom class: its healthy bookable atoms and the RUNNING bookings on them.

    `free` (atoms minus running) is what the placer ranks a pool's nodes by
    before it probes any booking, so planning reads a few index entries
    instead of every atom of the pool (`reservations.placer.plan`). PostgreSQL
    keeps the rows in the statement that inserts, moves or deletes a booking
    or changes a device (the triggers of migration 0007), so no writer can
    leave them behind; `reservations.rollups.counts.NODE_ATOM_COUNTS_SQL` is the
    recount the torture checks compare them with. A booking whose end has
    passed counts until the worker moves its phase (seconds): the count is a
    hint for ranking, and every plan still checks the atoms it picks.
    """

    id = models.BigAutoField(primary_key=True)
    node_id = models.CharField(max_length=57)
    pool_id = models.CharField(max_length=57)
    device_class = models.CharField(max_length=16)
    atoms = models.IntegerField(default=0)
    running = models.IntegerField(default=0)
    free = models.GeneratedField(
        expression=F("atoms") - F("running"), output_field=models.IntegerField(), db_persist=True
    )
    # A fixed pseudo-random order of the nodes within one `free` value: concurrent plans start
    # reading the index at different points (`placer.filters.candidates_sql`).
    spread = models.GeneratedField(
        expression=Func(F("node_id"), function="hashtext"),
        output_field=models.IntegerField(),
        db_persist=True,
    )
    # What the node contributes to its pool's fabric counts with (`PoolFabricCount`): kept by the
    # node's and pool's triggers as the node's schedulability and `fabric` label change.
    schedulable = models.BooleanField(db_default=False)
    fabric = models.TextField(db_default="")

    class Meta:
        db_table = "node_atom_counts"
        constraints = [
            models.UniqueConstraint(fields=["node_id", "device_class"], name="node_atom_counts_unique")
        ]
        indexes = [
            models.Index(fields=["pool_id", "device_class", "free", "spread"], name="node_atom_counts_rank")
        ]

    def __str__(self) -> str:
        return f"{self.node_id} {self.device_class} {self.free}/{self.atoms}"


class PoolFabricCount(models.Model):
    """A pool's counts per atom class and `fabric` label: what `capacity/byPool`'s fragmentation reads.

    Kept by PostgreSQL from `node_atom_counts` in the statement that changes
    one of its rows (migration 0017): over the schedulable nodes with atoms of
    the class, how many there are, how many have none booked now, how many of
    those hold eight whole GPUs (any free node, for a part-GPU class), and the
    free atoms on partly booked nodes. One row per fabric, so the read costs
    what its answer holds, not what the pool holds.
    """

    id = models.BigAutoField(primary_key=True)
    pool_id = models.CharField(max_length=57)
    device_class = models.CharField(max_length=16)
    fabric = models.TextField()
    nodes = models.IntegerField(default=0)
    nodes_free = models.IntegerField(default=0)
    whole_free = models.IntegerField(default=0)
    stranded = models.IntegerField(default=0)

    class Meta:
        db_table = "pool_fabric_counts"
        constraints = [
            models.UniqueConstraint(
                fields=["pool_id", "device_class", "fabric"], name="pool_fabric_counts_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.pool_id} {self.device_class} {self.fabric or '-'}"


# The counts of a rollup row, in the contract's order (the API, the CLI and the admin).
ROLLUP_COUNTS = (
    "total",
    "allocatable",
    "allocated",
    "reserved",
    "available",
    "provisioning",
    "unhealthy",
    "maintenance",
    "unreachable",
)


class PoolCapacityRollup(models.Model):
    """One row per pool and resource; the only thing capacity reads ever scan."""

    pool = models.ForeignKey("inventory.Pool", on_delete=models.CASCADE, related_name="rollups")
    resource = models.CharField(max_length=16)
    total = models.BigIntegerField(default=0)
    allocatable = models.BigIntegerField(default=0)
    allocated = models.BigIntegerField(default=0)
    reserved = models.BigIntegerField(default=0)
    provisioning = models.BigIntegerField(default=0)
    unhealthy = models.BigIntegerField(default=0)
    maintenance = models.BigIntegerField(default=0)
    unreachable = models.BigIntegerField(default=0)
    # Conservative on purpose: an atom booked now and later counts in both.
    available = models.GeneratedField(
        expression=Greatest(Value(0), F("allocatable") - F("allocated") - F("reserved")),
        output_field=models.BigIntegerField(),
        db_persist=True,
    )
    updated_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    rebuilt_at = models.DateTimeField(null=True, blank=True)
    # How many writes gave capacity back to this row (only grows): BookingRepair tries an
    # at-risk reservation again once its pool's sum has grown (`reservations.lifecycle.repair`).
    freed = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "pool_capacity_rollup"
        constraints = [
            models.UniqueConstraint(fields=["pool", "resource"], name="rollup_unique_pool_resource"),
            models.CheckConstraint(
                name="rollup_total_is_sum",
                condition=Q(
                    total=F("allocatable")
                    + F("provisioning")
                    + F("unhealthy")
                    + F("maintenance")
                    + F("unreachable")
                ),
            ),
        ]
        ordering = ["pool_id", "resource"]

    def __str__(self) -> str:
        return f"{self.pool_id} {self.resource}"
