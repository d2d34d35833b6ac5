"""`usage/hourly`: what a tenant held per hour (reservations read; decided on the pool with `poolId`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from capacity.selectors.usage import DEFAULT_LIMIT, MAX_LIMIT, usage_hourly, usage_window
from core.api.fields import (
    StrictCharField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    pool_id_field,
    tenant_id_field,
    time_ms_field,
)
from core.api.rpc import RpcViewSet, rpc_action, rpc_input
from core.api.schema import CURSOR_RULE, Rule
from core.authentication import principal_of
from core.constants import PROJECT_ID_REGEX
from core.decisions import RESERVATIONS_READ, decide_tenant
from core.errors import NotFound
from inventory.models import Project
from ledger.access import decide_pool

# A row's unit: atom-hours for atom classes, unit-hours for host scalars.
USAGE_UNITS = ("atom-hours", "unit-hours")


class UsageHourlyInput(StrictSerializer):
    """`{tenantId, poolId?, projectId?, from, to, limit?, cursor?}`; the window is checked after them."""

    tenantId = tenant_id_field()
    poolId = pool_id_field(required=False)
    projectId = StrictRegexField(PROJECT_ID_REGEX, max_length=56, required=False, source="project_id")
    # `from` is a Python keyword: declared under its JSON name in get_fields.
    to = time_ms_field(help_text="milliseconds since the epoch, exclusive; rounded up to the hour")
    limit = StrictIntegerField(
        min_value=1,
        max_value=MAX_LIMIT,
        required=False,
        default=DEFAULT_LIMIT,
        error_messages={
            "min_value": f"must be between 1 and {MAX_LIMIT}",
            "max_value": f"must be between 1 and {MAX_LIMIT}",
        },
    )
    cursor = StrictCharField(max_length=512, required=False, allow_null=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        start = time_ms_field(help_text="milliseconds since the epoch, inclusive; rounded down to the hour")
        head = {name: fields.pop(name) for name in ("tenantId", "poolId", "projectId")}
        return {**head, "from": start, **fields}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A bad window is a bad body: INVALID_INPUT before any decision (errors: 400, then 403).
        usage_window(from_ms=attrs["from"], to_ms=attrs["to"])
        return attrs


class UsageRowSerializer(serializers.Serializer):
    """One hour of one (pool, project, resource, spot) key; hours without usage have no row."""

    hour = serializers.IntegerField(help_text="the hour's start, milliseconds since the epoch (UTC)")
    poolId = serializers.CharField()
    projectId = serializers.CharField(allow_null=True, help_text="null: reservations without a project")
    resource = serializers.CharField(
        help_text="an atom class (gpu, gpu.mig, ...) or a host scalar (vcpu, ...)"
    )
    spot = serializers.BooleanField(help_text="spot reservations are counted apart from regular ones")
    unit = serializers.ChoiceField(choices=USAGE_UNITS)
    amount = serializers.FloatField(help_text="the usage in `unit`, rounded to six decimals")
    microseconds = serializers.IntegerField(
        help_text="the exact usage: quantity times microseconds held; sums of it are exact"
    )
    closed = serializers.BooleanField(
        help_text="true: read from the closed hour's rows; false: computed from the bookings up to now"
    )
    corrected = serializers.BooleanField(help_text="a late change was recorded after the hour closed")


class UsageHourlyOutput(serializers.Serializer):
    """`{tenantId, from, to, rows, nextCursor}`: `from` and `to` as widened to whole hours."""

    tenantId = serializers.CharField()
    to = serializers.IntegerField()
    rows = UsageRowSerializer(many=True)
    nextCursor = serializers.CharField(allow_null=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {"tenantId": fields.pop("tenantId"), "from": serializers.IntegerField(), **fields}


_EXAMPLES = [
    OpenApiExample(
        "one day of a pool",
        request_only=True,
        value={
            "tenantId": "acme",
            "poolId": "pool_01jz8q3v5kx2m7n9p4r6s8t0wy",
            "from": 1764547200000,
            "to": 1764633600000,
        },
    ),
    OpenApiExample(
        "two hours of GPUs and vCPUs",
        response_only=True,
        value={
            "tenantId": "acme",
            "from": 1764547200000,
            "to": 1764554400000,
            "rows": [
                {
                    "hour": 1764547200000,
                    "poolId": "pool_01jz8q3v5kx2m7n9p4r6s8t0wy",
                    "projectId": None,
                    "resource": "gpu",
                    "spot": False,
                    "unit": "atom-hours",
                    "amount": 6.5,
                    "microseconds": 23400000000,
                    "closed": True,
                    "corrected": False,
                },
                {
                    "hour": 1764547200000,
                    "poolId": "pool_01jz8q3v5kx2m7n9p4r6s8t0wy",
                    "projectId": None,
                    "resource": "vcpu",
                    "spot": False,
                    "unit": "unit-hours",
                    "amount": 24.0,
                    "microseconds": 86400000000,
                    "closed": True,
                    "corrected": False,
                },
                {
                    "hour": 1764550800000,
                    "poolId": "pool_01jz8q3v5kx2m7n9p4r6s8t0wy",
                    "projectId": None,
                    "resource": "gpu",
                    "spot": True,
                    "unit": "atom-hours",
                    "amount": 0.25,
                    "microseconds": 900000000,
                    "closed": False,
                    "corrected": False,
                },
            ],
            "nextCursor": None,
        },
    ),
]

USAGE_RULES = (
    Rule(("to",), "`to` is after `from` and at most 31 days (744 hours) after it, in whole hours"),
    CURSOR_RULE,
)


class UsageViewSet(RpcViewSet):
    """The usage group."""

    @extend_schema(examples=_EXAMPLES)
    @rpc_action(
        "hourly",
        request=UsageHourlyInput,
        response=UsageHourlyOutput,
        rules=USAGE_RULES,
        summary="What the tenant held, per hour, pool, project, resource and spot flag",
        description=(
            "Atoms in atom-hours, host scalars in unit-hours, each booking clipped to when it really "
            "ended (release, expiry, spot notice, preemption) and never counted past now. `from` is "
            "rounded down and `to` up to whole hours; `to` must be after `from` and at most 31 days "
            "(744 hours) after it, else INVALID_INPUT. Rows are ordered by hour, pool, project, resource "
            "and spot, and cursor-paginated (`limit` 1-1000, default 500); `nextCursor` is null on the "
            "last page. Closed hours are read as the worker wrote them (plus any correction); the open "
            "hour is computed on the fly (`closed: false`). Decided on the tenant (reservations read); "
            "with `poolId` on the pool too (NOT_FOUND when the tenant cannot see it); NOT_FOUND for a "
            "`projectId` that is not the tenant's."
        ),
    )
    def hourly(self, request: Request) -> Response:
        data = rpc_input(request, UsageHourlyInput)
        principal = principal_of(request)
        tenant_id = data["tenant_id"]
        pool_id = data.get("pool_id")
        if pool_id:
            decide_pool(
                principal=principal, tenant_id=tenant_id, pool_id=pool_id, permission=RESERVATIONS_READ
            )
        else:
            decide_tenant(principal=principal, tenant_id=tenant_id, permission=RESERVATIONS_READ)
        project_id = data.get("project_id")
        if project_id and not Project.objects.filter(pk=project_id, tenant_id=tenant_id).exists():
            raise NotFound("project not found")
        answer = usage_hourly(
            tenant_id=tenant_id,
            pool_id=pool_id,
            project_id=project_id,
            from_ms=data["from"],
            to_ms=data["to"],
            limit=data["limit"],
            cursor=data.get("cursor"),
        )
        # The selector already answers in the contract's shape (plain ints, floats and strings);
        # `UsageHourlyOutput` documents it (OpenAPI) without a second pass over a thousand rows.
        return Response(answer)
