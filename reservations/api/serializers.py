"""Input and output shapes of the reservations methods (contract.md).

The reservation request itself (the body of `reservations/create` and
`capacity/preview`) is `reservations.request.serializers.ReservationRequestSerializer`.
"""

from __future__ import annotations

from rest_framework import serializers

from core.api.fields import (
    StrictCharField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    pool_id_field,
    tenant_id_field,
)
from core.constants import RESERVATION_ID_REGEX
from reservations.models import ReservationState
from reservations.selectors import DEFAULT_LIMIT, MAX_LIMIT


class ReservationRefInput(StrictSerializer):
    """`{tenantId, reservationId}`: get, release and renew."""

    tenantId = tenant_id_field()
    reservationId = StrictRegexField(RESERVATION_ID_REGEX, max_length=57, source="reservation_id")


class ReservationListInput(StrictSerializer):
    tenantId = tenant_id_field()
    poolId = pool_id_field(required=False)
    state = serializers.ChoiceField(choices=ReservationState.values, required=False)
    limit = StrictIntegerField(min_value=1, max_value=MAX_LIMIT, required=False, default=DEFAULT_LIMIT)
    cursor = StrictCharField(max_length=512, required=False, allow_null=True)


class PlacementOutput(serializers.Serializer):
    cpus = serializers.ListField(
        child=serializers.IntegerField(), help_text="the CPUs the node pinned the workload to"
    )
    numaNodes = serializers.ListField(
        child=serializers.IntegerField(), help_text="the NUMA nodes of those CPUs (their memory)"
    )
    gpuLocal = serializers.BooleanField(help_text="true when every CPU is on a NUMA node of the booked GPUs")


class AllocationOutput(serializers.Serializer):
    id = serializers.CharField()
    nodeId = serializers.CharField()
    atoms = serializers.ListField(child=serializers.CharField())
    resources = serializers.DictField(child=serializers.IntegerField())
    placement = PlacementOutput(
        allow_null=True,
        help_text="where the node's agent put the workload, as it said when it accepted the assignment; "
        "null until it says (or on a node without an agent)",
    )


class NoticeOutput(serializers.Serializer):
    at = serializers.IntegerField()
    endsAt = serializers.IntegerField()


class AtRiskOutput(serializers.Serializer):
    reason = serializers.CharField(help_text="what keeps its bookings off schedulable atoms")
    since = serializers.IntegerField(help_text="when it was first found at risk, epoch milliseconds")


class ReservationOutput(serializers.Serializer):
    """A reservation: times are epoch milliseconds; `notice` is set on a displaced spot reservation.

    `atRisk` is set while a live reservation has a booking on a node or atom that
    left the schedulable set and could not be moved (BookingRepair).
    """

    id = serializers.CharField()
    tenantId = serializers.CharField()
    poolId = serializers.CharField()
    projectId = serializers.CharField(allow_null=True)
    state = serializers.ChoiceField(choices=ReservationState.values)
    spot = serializers.BooleanField()
    binding = serializers.CharField()
    start = serializers.IntegerField()
    end = serializers.IntegerField()
    leaseExpiresAt = serializers.IntegerField(allow_null=True)
    idempotencyKey = serializers.CharField()
    createdAt = serializers.IntegerField()
    allocations = AllocationOutput(many=True)
    notice = NoticeOutput(allow_null=True)
    atRisk = AtRiskOutput(allow_null=True)


class ReservationListOutput(serializers.Serializer):
    reservations = ReservationOutput(many=True)
    nextCursor = serializers.CharField(allow_null=True)
