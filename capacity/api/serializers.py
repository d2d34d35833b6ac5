"""Input and output of the `capacity/*` methods: the rollup reads and the placer's answers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from capacity.selectors.pools import SUMMED_FIELDS
from core.api.fields import DurationField, StrictRegexField, StrictSerializer, pool_id_field, tenant_id_field
from core.api.schema import Rule
from core.constants import MAX_TIME_MS, NODE_ID_REGEX
from core.errors import InvalidInput
from reservations.models import ROLLUP_COUNTS
from reservations.request.parse import invalid_input
from reservations.request.serializers import ITEM_RULES, ReservationRequestSerializer, bounded_int
from reservations.request.types import START_GRACE_MS, start_horizon_message, start_horizon_seconds


def _counts(names: tuple[str, ...], **help_texts: str) -> dict[str, serializers.Field]:
    """An integer field per count, in the order of `names` (the selector's), described by `help_texts`."""
    return {name: serializers.IntegerField(help_text=help_texts.get(name)) for name in names}


class SummaryInput(StrictSerializer):
    tenantId = tenant_id_field()


class ByPoolInput(StrictSerializer):
    tenantId = tenant_id_field()
    poolId = pool_id_field()


class RollupRowSerializer(serializers.Serializer):
    """One pool and resource; `total` = `allocatable` + the four buckets."""

    # Declared here, not as class attributes, so that the counts are the ones
    # the selector answers (`ROLLUP_COUNTS`, in the contract's order).
    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            "poolId": serializers.CharField(),
            "resource": serializers.CharField(),
            **_counts(ROLLUP_COUNTS, available="max(0, allocatable - allocated - reserved); conservative"),
            "updatedAt": serializers.IntegerField(help_text="milliseconds since the epoch"),
        }


class FragmentationGroupSerializer(serializers.Serializer):
    value = serializers.CharField(help_text="the label's value; empty for nodes without the label")
    nodes = serializers.IntegerField(help_text="schedulable nodes with healthy atoms of the class")
    nodesFree = serializers.IntegerField(help_text="of those, nodes with none of those atoms booked now")
    wholeNodeGang = serializers.IntegerField(
        help_text="of the free ones, nodes with eight or more whole GPUs: the largest gang of whole"
        " 8-GPU nodes that fits now (in a MIG or time-slice pool, every free node)"
    )
    strandedAtoms = serializers.IntegerField(help_text="free atoms on partly booked nodes")


class FragmentationSerializer(serializers.Serializer):
    topologyKey = serializers.CharField(help_text="the node label the groups are by (`fabric`)")
    deviceClass = serializers.CharField(help_text="the pool's GPU atom class: gpu, gpu.mig or gpu.slot")
    groups = FragmentationGroupSerializer(many=True)


class ByPoolOutput(serializers.Serializer):
    poolId = serializers.CharField()
    rows = RollupRowSerializer(many=True)
    atRiskReservations = serializers.IntegerField(
        help_text="live reservations of the pool marked at risk by BookingRepair (every tenant's)"
    )
    fragmentation = FragmentationSerializer()


class SummaryPoolSerializer(serializers.Serializer):
    poolId = serializers.CharField()
    name = serializers.CharField()
    ownerTenantId = serializers.CharField()
    offered = serializers.BooleanField()
    archived = serializers.BooleanField()
    gpuModel = serializers.CharField(allow_null=True)
    sharing = serializers.CharField()
    capacity = RollupRowSerializer(many=True)


class GpuTotalsSerializer(serializers.Serializer):
    # What `byGpuModel` sums from each pool's `gpu` row (`SUMMED_FIELDS`). A
    # comment, not a docstring: the OpenAPI document would show a docstring.
    def get_fields(self) -> dict[str, serializers.Field]:
        return _counts(SUMMED_FIELDS)


class SummaryOutput(serializers.Serializer):
    tenantId = serializers.CharField()
    pools = SummaryPoolSerializer(many=True)
    byGpuModel = serializers.DictField(
        child=GpuTotalsSerializer(), help_text="`gpu` rows summed per GPU model; `other` when none"
    )


class ExplainNodeInput(serializers.Serializer):
    """`capacity/explain`'s own field: the one node to explain."""

    nodeId = StrictRegexField(NODE_ID_REGEX, max_length=57)


class ExplainInput(ReservationRequestSerializer):
    """The body of `capacity/explain`: a preview's, and optionally one node (for the OpenAPI document)."""

    nodeId = StrictRegexField(NODE_ID_REGEX, max_length=57, required=False)


# capacity/earliest searches at most this far, and a week when the body does not say.
EARLIEST_HORIZON_MAX_SECONDS = 30 * 86400


EARLIEST_HORIZON_DEFAULT_SECONDS = 7 * 86400


EARLIEST_RULES = (
    *ITEM_RULES,
    Rule(
        ("from",),
        "`from` is at most 5 minutes before now and at most the booking horizon (365 days by default) "
        "after it",
    ),
    Rule(("horizon",), "a horizon string's value is at most 30 days, as the integer's"),
)


def horizon_field(**kwargs: Any) -> DurationField:
    """How far past `from` capacity/earliest may start the request: seconds or a duration string."""
    return DurationField(minimum=0, maximum=EARLIEST_HORIZON_MAX_SECONDS, example="7d", **kwargs)


class EarliestSearchInput(StrictSerializer):
    """`capacity/earliest`'s own fields: where the search starts and how far it goes."""

    # `from` is a Python keyword: the field is declared under its JSON name below.
    horizon = horizon_field(
        required=False,
        help_text="seconds or a duration string (`7d`, `36h`); at most 30 days; default 7 days",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = bounded_int(
            0,
            MAX_TIME_MS,
            required=False,
            allow_null=True,
            help_text="ms since the epoch; default now; not more than 5 minutes in the past",
        )
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start = attrs.get("from")
        if start is not None:
            from core.clock import compute_now, to_millis

            now_ms = int(to_millis(compute_now()) or 0)
            if start < now_ms - START_GRACE_MS:
                raise serializers.ValidationError({"from": ["must not be more than 5 minutes in the past"]})
            horizon = start_horizon_seconds()
            if start > now_ms + horizon * 1000:
                raise serializers.ValidationError({"from": [start_horizon_message(horizon)]})
        return attrs


class EarliestInput(ReservationRequestSerializer):
    """The body of `capacity/earliest`: a preview's without `start`, plus `from` and `horizon` (OpenAPI)."""

    horizon = horizon_field(required=False, help_text=EarliestSearchInput().fields["horizon"].help_text)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields.pop("start", None)
        fields["from"] = EarliestSearchInput().get_fields()["from"]
        return fields


def earliest_input_split(data: Any) -> tuple[Any, dict[str, Any]]:
    """Split a capacity/earliest body into the reservation request and the search's own fields.

    The request part is validated as preview's; the search part here, with
    INVALID_INPUT naming `from`, `horizon`, or a `start` (the search chooses it).
    """
    if not isinstance(data, dict):
        return data, {}
    body = dict(data)
    if "start" in body:
        raise InvalidInput.field("start", "capacity/earliest chooses the start: give `from` to search from")
    search = {key: body.pop(key) for key in ("from", "horizon") if key in body}
    serializer = EarliestSearchInput(data=search)
    if not serializer.is_valid():
        raise invalid_input(serializer.errors)
    return body, dict(serializer.validated_data)


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
