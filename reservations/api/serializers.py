"""Input and output shapes of the reservations methods and `capacity/preview` (contract.md).

The reservation request itself is `reservations.request.ReservationRequestSerializer`,
shared by `reservations/create` and `capacity/preview`.
"""

from __future__ import annotations

from rest_framework import serializers

from core.api import (
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


class AllocationOutput(serializers.Serializer):
    id = serializers.CharField()
    nodeId = serializers.CharField()
    atoms = serializers.ListField(child=serializers.CharField())
    resources = serializers.DictField(child=serializers.IntegerField())


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


class CandidateOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    atoms = serializers.ListField(child=serializers.CharField())
    score = serializers.FloatField()


class ReasonOutput(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class PreemptibleOutput(serializers.Serializer):
    count = serializers.IntegerField()
    startsAt = serializers.IntegerField()


class PreviewOutput(serializers.Serializer):
    fits = serializers.BooleanField()
    start = serializers.IntegerField()
    end = serializers.IntegerField()
    candidates = CandidateOutput(many=True)
    reason = ReasonOutput(allow_null=True)
    preemptible = PreemptibleOutput(allow_null=True)


class ExplainSampleOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    reason = serializers.CharField()


class ExplainRemovedOutput(serializers.Serializer):
    notSchedulable = serializers.DictField(
        child=serializers.IntegerField(), help_text="per bucket: maintenance, unreachable, unhealthy, ..."
    )
    scalars = serializers.IntegerField()
    selector = serializers.IntegerField()
    noFreeAtoms = serializers.IntegerField()
    topology = serializers.IntegerField()


class ExplainOutput(serializers.Serializer):
    nodes = serializers.IntegerField(help_text="the nodes looked at: the pool's, or the one named")
    removed = ExplainRemovedOutput()
    fit = serializers.IntegerField(help_text="nodes no filter removed")
    samples = serializers.DictField(
        child=ExplainSampleOutput(many=True), help_text="up to 10 nodes per filter, each with its reason"
    )
    preview = PreviewOutput()


class EarliestOutput(serializers.Serializer):
    fits = serializers.BooleanField(help_text="whether some start in the horizon fits")
    start = serializers.IntegerField(allow_null=True, help_text="the earliest start that fits (ms), or null")
    end = serializers.IntegerField(allow_null=True, help_text="start + duration (ms), or null")
    candidates = CandidateOutput(many=True, help_text="what capacity.preview would answer at that start")
    reason = ReasonOutput(allow_null=True, help_text="why nothing fits in the horizon")
    searchedFrom = serializers.IntegerField(help_text="the first start looked at (ms): `from`, or now")
    searchedTo = serializers.IntegerField(help_text="the last start looked at (ms)")
    instantsTried = serializers.IntegerField(help_text="instants the placer was asked at")
