"""`capacity/timeline`: whole GPUs booked per time bucket of one pool (capacity read, on the pool)."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from capacity.api.views import pool_read_input
from capacity.selectors.timeline import MAX_STEP_MINUTES, MIN_STEP_MINUTES, timeline_compute
from core.api.fields import (
    StrictIntegerField,
    StrictSerializer,
    pool_id_field,
    tenant_id_field,
    time_ms_field,
)
from core.api.rpc import RpcViewSet, rpc_action, rpc_output
from core.api.schema import Rule


class TimelineInput(StrictSerializer):
    """`{tenantId, poolId, from?, to?, stepMinutes?}`; `timeline_window` checks the window."""

    tenantId = tenant_id_field()
    poolId = pool_id_field()
    # `from` is a Python keyword: declared under its JSON name in get_fields.
    to = time_ms_field(required=False, allow_null=True, help_text="milliseconds since the epoch; from + 24 h")
    stepMinutes = StrictIntegerField(
        min_value=MIN_STEP_MINUTES,
        max_value=MAX_STEP_MINUTES,
        required=False,
        allow_null=True,
        help_text="bucket length; default 60",
        error_messages={
            "min_value": f"must be between {MIN_STEP_MINUTES} and {MAX_STEP_MINUTES}",
            "max_value": f"must be between {MIN_STEP_MINUTES} and {MAX_STEP_MINUTES}",
        },
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        start = time_ms_field(
            required=False, allow_null=True, help_text="milliseconds since the epoch; the current hour"
        )
        return {"tenantId": fields.pop("tenantId"), "poolId": fields.pop("poolId"), "from": start, **fields}


class TimelineBucketSerializer(serializers.Serializer):
    """One bucket `[start, end)`; the last one ends at `to`."""

    start = serializers.IntegerField(help_text="milliseconds since the epoch, inclusive")
    end = serializers.IntegerField(help_text="milliseconds since the epoch, exclusive")
    booked = serializers.IntegerField(help_text="distinct whole GPUs with a booking overlapping the bucket")
    free = serializers.IntegerField(help_text="max(0, allocatable - booked)")


class TimelineOutput(serializers.Serializer):
    """`{poolId, from, to, stepMinutes, allocatable, buckets}`."""

    poolId = serializers.CharField()
    to = serializers.IntegerField()
    stepMinutes = serializers.IntegerField()
    allocatable = serializers.IntegerField(help_text="from the pool's current gpu rollup row")
    buckets = TimelineBucketSerializer(many=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {"poolId": fields.pop("poolId"), "from": serializers.IntegerField(), **fields}


TIMELINE_RULES = (
    Rule(("to",), "`to` is after `from` (given or defaulted) and at most 7 days after it"),
    Rule(("stepMinutes",), "the window holds at most 336 buckets of `stepMinutes`"),
)


class TimelineViewSet(RpcViewSet):
    """The capacity group's timeline method (the other capacity reads are in `capacity.api.views`)."""

    @rpc_action(
        "timeline",
        request=TimelineInput,
        response=TimelineOutput,
        rules=TIMELINE_RULES,
        summary="Whole GPUs booked per time bucket of one pool, and how many stay free",
        description=(
            "`from` defaults to the start of the current hour, `to` to 24 hours after `from`, "
            "`stepMinutes` to 60 (5-1440). A timeline spans at most 7 days and 336 buckets, and `to` "
            "must be after `from`; otherwise INVALID_INPUT. `allocatable` comes from the pool's current "
            "`gpu` rollup row; each bucket's `free` is `allocatable - booked`, never below 0. MIG and "
            "slot atoms are not counted. NOT_FOUND when the pool is not visible to the tenant."
        ),
    )
    def timeline(self, request: Request) -> Response:
        data, pool = pool_read_input(request, TimelineInput)
        answer = timeline_compute(
            pool=pool,
            from_ms=data.get("from"),
            to_ms=data.get("to"),
            step_minutes=data.get("stepMinutes"),
        )
        return rpc_output(TimelineOutput, answer)
