"""Reservations, allocations (one per node), device bookings (one per atom) and the rollups they move.

The counts kept beside the bookings (a pool's rollup rows, one per resource,
which every booking's transaction moves by its delta, and the per-node and
per-fabric counts PostgreSQL keeps) are in `counts`, and importable from here.
"""

from __future__ import annotations

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeOperators
from django.contrib.postgres.indexes import GistIndex
from django.db import models
from django.db.models import Func, Q
from django.db.models.functions import Cast, Coalesce

from core import ids
from reservations.models.counts import (
    ROLLUP_COUNTS as ROLLUP_COUNTS,
)
from reservations.models.counts import (
    NodeAtomCount as NodeAtomCount,
)
from reservations.models.counts import (
    PoolCapacityRollup as PoolCapacityRollup,
)
from reservations.models.counts import (
    PoolFabricCount as PoolFabricCount,
)


class Upper(Func):
    """`upper(range)`: the end of a booking's `during` (NULL when open-ended)."""

    function = "upper"
    output_field = models.DateTimeField()


class LowerBound(Func):
    """`lower(range)`: the start of a booking's `during`."""

    function = "lower"
    output_field = models.DateTimeField()


class ReservationState(models.TextChoices):
    SCHEDULED = "scheduled"
    ACTIVE = "active"
    ENDED = "ended"
    RELEASED = "released"
    PREEMPTED = "preempted"


class Binding(models.TextChoices):
    HOLD = "hold"
    NODE = "node"


class Reservation(models.Model):
    id = models.CharField(primary_key=True, max_length=57, default=ids.id_default(ids.RESERVATION))
    # The foreign keys' indexes are declared in Meta: a plain btree each, without the
    # `varchar_pattern_ops` copy Django adds for `LIKE` (migration 0018).
    tenant = models.ForeignKey(
        "core.Tenant", on_delete=models.PROTECT, related_name="reservations", db_index=False
    )
    pool = models.ForeignKey(
        "inventory.Pool", on_delete=models.PROTECT, related_name="reservations", db_index=False
    )
    project = models.ForeignKey(
        "inventory.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # The request as the client gave it, and its canonical digest for idempotency.
    request = models.JSONField()
    request_digest = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=128)
    spot = models.BooleanField(default=False)
    binding = models.CharField(max_length=8, choices=Binding.choices, default=Binding.HOLD)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=ReservationState.choices)
    lease_seconds = models.PositiveIntegerField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # A spot reservation displaced by a regular one: when it was told, and its new end.
    notice_at = models.DateTimeField(null=True, blank=True)
    notice_ends_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True)
    # BookingRepair: a booking sits on an atom that left the schedulable set and cannot move.
    at_risk_reason = models.TextField(blank=True)
    at_risk_since = models.DateTimeField(null=True, blank=True)
    # The pool's `freed` count BookingRepair read before its last failed attempt to move this
    # reservation: the next attempt waits until capacity was freed in the pool since.
    at_risk_freed = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="reservation_unique_idempotency_key"
            ),
            models.CheckConstraint(
                name="reservation_ends_after_start", condition=Q(ends_at__gt=models.F("starts_at"))
            ),
        ]
        indexes = [
            # The tenant's are the ones below, which all lead with it.
            models.Index(fields=["pool"], name="reservation_pool"),
            models.Index(fields=["project"], name="reservation_project"),
            # reservations/list: a tenant's newest first, by cursor on (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="reservation_tenant_newest"),
            # The lease reconciler finds expired leases of live reservations.
            models.Index(
                fields=["lease_expires_at"],
                name="reservation_lease_live",
                condition=Q(state__in=["scheduled", "active"], lease_expires_at__isnull=False),
            ),
            # Settlement finds live reservations that reached their end.
            models.Index(
                fields=["ends_at"],
                name="reservation_live_ends",
                condition=Q(state__in=["scheduled", "active"]),
            ),
            # A concurrent quota's peak (`reservations.selectors.holdings_peaks`): the tenant's live
            # reservations in the pool that start before the new one's window ends.
            models.Index(
                fields=["tenant", "pool", "starts_at"],
                name="reservation_tenant_pool_live",
                condition=Q(state__in=["scheduled", "active"]),
            ),
            # One tenant's reservations that reach past an instant: hourly usage of
            # the hours not closed yet reads the tenant's bookings from these.
            models.Index(fields=["tenant", "ends_at"], name="reservation_tenant_ends"),
            # The at-risk count per pool (capacity/byPool) and the repair's retries.
            models.Index(
                fields=["pool", "at_risk_since"],
                name="reservation_at_risk",
                condition=Q(at_risk_since__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.id


class Allocation(models.Model):
    """One node's share of a reservation, with the scalar claims taken from that node."""

    id = models.CharField(primary_key=True, max_length=58, default=ids.id_default(ids.ALLOCATION))
    # Indexed by `allocation_one_per_node` (reservation, node) and `allocation_node`.
    reservation = models.ForeignKey(
        Reservation, on_delete=models.CASCADE, related_name="allocations", db_index=False
    )
    node = models.ForeignKey(
        "inventory.Node", on_delete=models.PROTECT, related_name="allocations", db_index=False
    )
    # {"vcpu": 16, "memoryGiB": 128, "hugepages1Gi": 0}; given back on release.
    resources = models.JSONField(default=dict, blank=True)
    # What the node's agent gave the workload: {"cpus": [0, 1], "numaNodes": [0], "gpuLocal": true}.
    placement = models.JSONField(null=True, blank=True)
    released = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reservation", "node"], name="allocation_one_per_node")
        ]
        indexes = [models.Index(fields=["node"], name="allocation_node")]

    def __str__(self) -> str:
        return self.id


class BookingPurpose(models.TextChoices):
    ALLOCATION = "allocation"
    # Guard 2: a MIG or slot layout change books every atom of the GPU for the change window.
    LAYOUT_CHANGE = "layout-change"
    # A planned maintenance window holds every atom of its nodes (`reservations.maintenance`).
    MAINTENANCE = "maintenance"


class BookingPhase(models.IntegerChoices):
    """Where the rollups count a booking: `reserved`, `allocated`, or no longer.

    Set on insert by a trigger from the booking's window and `compute_now()`
    (the clock the inserting transaction's deltas use), moved forward by the
    worker (`reservations.lifecycle.phases`) when the booking starts and ends, with the
    matching rollup deltas in the same transaction. The rebuild counts phases,
    so it and the deltas agree by construction.
    """

    FUTURE = 0
    RUNNING = 1
    OVER = 2


class DeviceBooking(models.Model):
    """A claim on one atom for `[start, end)`. History: a release shortens `during`."""

    id = models.BigAutoField(primary_key=True)
    # Every booking row version writes an entry in each index of the table, so the
    # foreign keys' are only those declared in Meta: `booking_device_ends` leads with
    # the device, `booking_allocation` and `booking_window` are the others.
    device = models.ForeignKey(
        "inventory.Device", on_delete=models.PROTECT, related_name="bookings", db_index=False
    )
    allocation = models.ForeignKey(
        Allocation, null=True, blank=True, on_delete=models.CASCADE, related_name="bookings", db_index=False
    )
    purpose = models.CharField(
        max_length=16, choices=BookingPurpose.choices, default=BookingPurpose.ALLOCATION
    )
    during = DateTimeRangeField()
    # The maintenance window a `maintenance` booking holds the atom for (null for every other purpose).
    window = models.ForeignKey(
        "MaintenanceWindow",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="bookings",
        db_index=False,
    )
    # The pool of the device's node, always (the `device_bookings_pool` trigger, migration 0010):
    # the distribution column a sharded PostgreSQL (Citus, keyed by pool) needs in guard 1.
    pool_id = models.CharField(max_length=64, editable=False)
    # Overwritten on insert by the `device_bookings_phase` trigger (migration 0006).
    phase = models.PositiveSmallIntegerField(choices=BookingPhase.choices, db_default=BookingPhase.FUTURE)

    class Meta:
        db_table = "device_bookings"
        constraints = [
            # Guard 1: at most one booking per atom per instant, whatever the code above does.
            # `pool_id` is the shard key a distributed PostgreSQL needs in the constraint;
            # every booking of a device carries the device's pool, so this refuses exactly
            # what (device, during) alone would. The device comes first: GiST tests an
            # entry's keys in column order, and the device's integer tells entries apart
            # where the pool's text, the same for most of them, does not (migration 0018).
            ExclusionConstraint(
                name="device_bookings_no_overlap",
                expressions=[
                    ("device", RangeOperators.EQUAL),
                    ("pool_id", RangeOperators.EQUAL),
                    ("during", RangeOperators.OVERLAPS),
                ],
            ),
            models.CheckConstraint(
                name="device_bookings_allocation_iff_purpose",
                condition=Q(purpose="allocation", allocation__isnull=False, window__isnull=True)
                | Q(purpose="layout-change", allocation__isnull=True, window__isnull=True)
                | Q(purpose="maintenance", allocation__isnull=True, window__isnull=False),
            ),
            models.CheckConstraint(name="device_bookings_nonempty", condition=~Q(during__isempty=True)),
        ]
        indexes = [
            models.Index(fields=["allocation"], name="booking_allocation"),
            models.Index(fields=["window"], name="booking_window", condition=Q(window__isnull=False)),
            # The timeline and the rebuild scan bookings by time, not by device.
            GistIndex(fields=["during"], name="booking_during"),
            # The placer's "is this atom free for the window" probe, once per candidate atom:
            # (device, end) skips the atom's history, `during` is included for the overlap
            # check; a GiST probe of guard 1's index costs about 7x more at 10,000 nodes.
            models.Index(
                models.F("device"),
                Coalesce(Upper("during"), Cast(models.Value("infinity"), models.DateTimeField())),
                include=["during"],
                name="booking_device_ends",
            ),
            # The worker's next deadlines: the earliest start of a booking still counted
            # as reserved, and the earliest end of one counted as allocated.
            models.Index(LowerBound("during"), name="booking_phase_future", condition=Q(phase=0)),
            models.Index(Upper("during"), name="booking_phase_running", condition=Q(phase=1)),
        ]

    def __str__(self) -> str:
        return f"{self.device_id} {self.during}"


# The id prefix of a maintenance window (`mw_01k...`).
MAINTENANCE_WINDOW_PREFIX = "mw"
MAINTENANCE_WINDOW_ID_REGEX = rf"^{MAINTENANCE_WINDOW_PREFIX}_[0-9a-hjkmnp-tv-z]{{26,52}}$"


class MaintenanceWindowState(models.TextChoices):
    """A window's life: booked ahead, its nodes in maintenance, over, or called off."""

    SCHEDULED = "scheduled"
    ACTIVE = "active"
    ENDED = "ended"
    CANCELLED = "cancelled"


class MaintenanceWindow(models.Model):
    """Planned downtime of some nodes for `[starts_at, ends_at)`, held as bookings of their atoms.

    The bookings make guard 1 refuse a tenant's booking into the window; the
    worker puts the nodes in maintenance at the start and takes them out at
    the end (`reservations.maintenance.toggle`).
    """

    id = models.CharField(primary_key=True, max_length=57, default=ids.id_default(MAINTENANCE_WINDOW_PREFIX))
    reason = models.TextField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(
        max_length=16, choices=MaintenanceWindowState.choices, default=MaintenanceWindowState.SCHEDULED
    )
    created_by = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    updated_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        db_table = "reservations_maintenancewindow"
        constraints = [
            models.CheckConstraint(
                name="maintenance_window_ends_after_start", condition=Q(ends_at__gt=models.F("starts_at"))
            )
        ]
        indexes = [
            # The worker's next start and end, and the live windows every reader asks about.
            models.Index(
                fields=["starts_at", "ends_at"],
                name="maintenance_window_live",
                condition=Q(state__in=["scheduled", "active"]),
            )
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.reason!r}"


class MaintenanceWindowNode(models.Model):
    """One node of a window, and whether the window (not an operator before it) turned its maintenance on."""

    window = models.ForeignKey(MaintenanceWindow, on_delete=models.CASCADE, related_name="members")
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="maintenance_windows")
    # Set when the worker put the node in maintenance at the window's start; only then does
    # the end take it out again (a node already in maintenance stays as the operator left it).
    switched_on = models.BooleanField(default=False)

    class Meta:
        db_table = "reservations_maintenancewindownode"
        constraints = [
            models.UniqueConstraint(fields=["window", "node"], name="maintenance_window_node_unique")
        ]
        indexes = [models.Index(fields=["node"], name="maintenance_window_node")]

    def __str__(self) -> str:
        return f"{self.window_id} {self.node_id}"


class WaitSlot(models.Model):
    """One of a tenant's leased slots for a create waiting on capacity (`reservations.waits`).

    A row is taken with a single upsert and given back when the wait ends; its
    lease (`expires_at`) frees it by itself if the process died while waiting.
    """

    tenant_id = models.CharField(max_length=128)
    slot = models.PositiveSmallIntegerField()
    holder = models.CharField(max_length=32)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "slot"], name="waitslot_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id} #{self.slot}"


class DeliveryKind(models.TextChoices):
    ASSIGN = "assign"
    SHORTEN = "shorten"


class Delivery(models.Model):
    """The outbox: what a node must be told about a reservation, written in the booking transaction.

    Delivered after commit and deleted once the node answered; the worker
    retries what is left (a crash between commit and delivery loses nothing).
    """

    id = models.BigAutoField(primary_key=True)
    reservation = models.ForeignKey(
        Reservation, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    kind = models.CharField(max_length=8, choices=DeliveryKind.choices)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_due"),
            models.Index(fields=["reservation"], name="delivery_reservation"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.reservation_id}"


class NodeChange(models.Model):
    """What a node's agent must apply, in order: the agent transport's per-node outbox.

    Written when a reservation's delivery runs for a node with an agent, and kept
    until the agent answers (`nodes/ack`), across restarts of either side. Its id
    is the agent's `deliveryId`: increasing, so an agent asks for what follows
    the last one it applied (`nodes/assignments {after}`).
    """

    id = models.BigAutoField(primary_key=True)
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="changes")
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="node_changes")
    kind = models.CharField(max_length=8, choices=DeliveryKind.choices)
    payload = models.JSONField()
    created_at = models.DateTimeField(db_default=models.Func(function="compute_now"))
    answered_at = models.DateTimeField(null=True, blank=True)
    accepted = models.BooleanField(null=True)
    reason = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["node", "id"], name="nodechange_node")]

    def __str__(self) -> str:
        return f"{self.kind} {self.reservation_id} on {self.node_id}"


class RepairRequest(models.Model):
    """A node whose booked atoms left the counted set, written by the change's transaction.

    BookingRepair's next run looks at its bookings and deletes the rows it read.
    """

    id = models.BigAutoField(primary_key=True)
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="+")
    requested_at = models.DateTimeField(db_default=models.Func(function="compute_now"))

    class Meta:
        db_table = "repair_requests"

    def __str__(self) -> str:
        return f"repair {self.node_id}"
