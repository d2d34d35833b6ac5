"""Reservations, allocations and bookings: read-only, plus a release with a reason.

Bookings are history guarded by the exclusion constraint, and a reservation's
state moves only through the services (which also return quota and apply the
rollup delta), so nothing here edits a row.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from core.admin import ReadOnlyAdmin, ReasonForm, admin_actor, plural, reason_action
from core.ranges import ranges_text
from reservations.models import Allocation, DeviceBooking, Reservation, ReservationState

LIVE_STATES = (ReservationState.SCHEDULED, ReservationState.ACTIVE)


def placement_text(placement: dict[str, Any] | None) -> str:
    """An allocation's placement as an operator reads it: `CPUs 0-15 · NUMA 0 · local to its GPUs`."""
    if not placement:
        return "not reported"
    cpus = ranges_text(placement.get("cpus", ())) or "none"
    numa = ranges_text(placement.get("numaNodes", ())) or "none"
    local = "local to its GPUs" if placement.get("gpuLocal") else "not local to its GPUs"
    return f"CPUs {cpus} · NUMA {numa} · {local}"


class PlacementDisplay:
    """The `placement` column of the allocation admins: what the node said it gave the workload."""

    @admin.display(description="placement")
    def placement_shown(self, obj: Allocation) -> str:
        return placement_text(obj.placement)


class AllocationInline(PlacementDisplay, admin.TabularInline):
    model = Allocation
    extra = 0
    fields = ("id", "node", "resources", "placement_shown", "released", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "pool", "state", "spot", "binding", "starts_at", "ends_at", "created_at")
    list_filter = (
        "state",
        "spot",
        "binding",
        ("pool", admin.RelatedOnlyFieldListFilter),
        ("tenant", admin.RelatedOnlyFieldListFilter),
    )
    list_select_related = ("tenant", "pool")
    search_fields = ("id", "idempotency_key", "tenant__id", "pool__name")
    date_hierarchy = "starts_at"
    inlines = (AllocationInline,)
    actions = ("release_reservations",)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Read-only, but the change page must open to be looked at (Django needs view or change).
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("inventory.operate_nodes"))

    @admin.action(description="Release selected reservations…", permissions=["release"])
    @reason_action(
        title="Release reservations",
        form_class=ReasonForm,
        done=lambda n: f"Released {plural(n, 'reservation')}; their atoms are free from now.",
        warning="The tenants' workloads lose their GPUs now.",
    )
    def release_reservations(
        self, request: HttpRequest, reservation: Reservation, data: dict[str, Any]
    ) -> bool:
        from reservations.services import reservation_release

        if reservation.state not in LIVE_STATES:
            return False
        # The service records the release in the audit trail itself.
        reservation_release(reservation=reservation, actor=admin_actor(request), reason=data["reason"])
        return True


@admin.register(Allocation)
class AllocationAdmin(PlacementDisplay, ReadOnlyAdmin):
    list_display = ("id", "reservation", "node", "resources", "placement_shown", "released", "created_at")
    list_filter = ("released",)
    list_select_related = ("reservation", "node")
    search_fields = ("id", "reservation__id", "node__hostname")


@admin.register(DeviceBooking)
class DeviceBookingAdmin(ReadOnlyAdmin):
    list_display = ("id", "device", "node", "allocation", "reservation", "purpose", "starts", "ends")
    list_filter = ("purpose",)
    list_select_related = ("device", "device__node", "allocation")
    search_fields = ("device__uid", "allocation__id", "allocation__reservation__id", "device__node__hostname")

    @admin.display(description="node")
    def node(self, obj: DeviceBooking) -> str:
        return obj.device.node.hostname

    @admin.display(description="reservation")
    def reservation(self, obj: DeviceBooking) -> str:
        return obj.allocation.reservation_id if obj.allocation else "—"

    @admin.display(description="from")
    def starts(self, obj: DeviceBooking) -> Any:
        return obj.during.lower

    @admin.display(description="until")
    def ends(self, obj: DeviceBooking) -> Any:
        return obj.during.upper
