"""Input and output of the operator's and node agents' methods (contract.md).

Pools and offerings: `pools/*` (but `pools/capacity`) and `offerings/*`. Nodes:
`nodes/*`, `devices/setHealth` and `inventory/report`.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from core.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    node_id_field,
    pool_id_field,
    tenant_id_field,
)
from core.constants import TOPOLOGY_KEY_REGEX
from core.json_input import FREE_TEXT_PATTERN
from inventory.choices import ALL_RESOURCES, DeviceClass, Sharing
from inventory.models import TaintEffect
from inventory.reports import report_schema
from inventory.schedulability import EXCLUDED, MAINTENANCE, PROVISIONING, SCHEDULABLE, UNHEALTHY, UNREACHABLE
from inventory.selectors import NODE_LIST_DEFAULT, NODE_LIST_MAX
from inventory.services.pools import POOL_NAME_RE
from ledger.models import QuotaMode


def _strings(*names: str) -> dict[str, serializers.Field]:
    """A plain string output field per name, in order: the runs of them in the records below."""
    return {name: serializers.CharField() for name in names}


# --- pools and offerings ----------------------------------------------------------------------

LIST_MAX = 500
LIST_DEFAULT = 100
LABELS_MAX = 64
QUOTA_MAX = 1 << 40
LABEL_KEY_REGEX = r"^[A-Za-z0-9._/-]{1,63}$"

# The bucket a node counts in (`inventory.schedulability`), in the order the consoles show them.
NODE_BUCKETS = (SCHEDULABLE, PROVISIONING, MAINTENANCE, UNREACHABLE, UNHEALTHY, EXCLUDED)


class LabelsField(serializers.DictField):
    """`{"region": "eu-west"}`: at most 64 labels, keys as node labels, values strings of at most 256."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StrictCharField(max_length=256, allow_blank=True), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value: dict[str, str] = super().to_internal_value(data)
        if len(value) > LABELS_MAX:
            raise serializers.ValidationError(f"at most {LABELS_MAX} labels")
        bad = sorted(key for key in value if re.fullmatch(LABEL_KEY_REGEX, key) is None)
        if bad:
            raise serializers.ValidationError(f"label key {bad[0]!r} must match {LABEL_KEY_REGEX}")
        return value

    openapi_component = "Labels"

    def openapi_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "patternProperties": {
                LABEL_KEY_REGEX: {"type": "string", "maxLength": 256, "pattern": FREE_TEXT_PATTERN}
            },
            "additionalProperties": False,
            "maxProperties": LABELS_MAX,
            "example": {"region": "us-east"},
        }


class QuotaField(serializers.DictField):
    """`{"gpu": 16, "vcpu": 512}`: a limit per known resource (0 to 2^40); `null` removes one (update)."""

    def __init__(self, *, allow_remove: bool, **kwargs: Any) -> None:
        self.allow_remove = allow_remove
        # An update's quota takes `null` (remove the limit); a create's does not.
        self.openapi_component = "QuotaChange" if allow_remove else "Quota"
        super().__init__(
            child=StrictIntegerField(min_value=0, max_value=QUOTA_MAX, allow_null=allow_remove), **kwargs
        )

    def to_internal_value(self, data: Any) -> dict[str, int | None]:
        if isinstance(data, dict):
            unknown = sorted(key for key in data if key not in ALL_RESOURCES)
            if unknown:
                raise serializers.ValidationError(
                    f"unknown resource {unknown[0]} (one of {', '.join(ALL_RESOURCES)})"
                )
        value: dict[str, int | None] = super().to_internal_value(data)
        return value

    def openapi_schema(self) -> dict[str, Any]:
        limit: dict[str, Any] = {"type": ["integer", "null"] if self.allow_remove else "integer"}
        limit |= {"minimum": 0, "maximum": QUOTA_MAX}
        return {
            "type": "object",
            "properties": {resource: limit for resource in ALL_RESOURCES},
            "additionalProperties": False,
            "example": {"gpu": 16},
        }


class PoolCreateInput(StrictSerializer):
    ownerTenantId = tenant_id_field(source="owner_id")
    name = StrictRegexField(POOL_NAME_RE.pattern, max_length=128)
    gpuModel = StrictCharField(
        max_length=64, required=False, allow_blank=True, default="", source="gpu_model"
    )
    sharing = serializers.ChoiceField(choices=Sharing.values, required=False, default=Sharing.EXCLUSIVE)
    slotsPerGpu = StrictIntegerField(min_value=1, max_value=64, required=False, source="slots_per_gpu")
    noticeSeconds = StrictIntegerField(
        min_value=0, max_value=86400, required=False, default=30, source="notice_seconds"
    )
    labels = LabelsField(required=False, default=dict)
    # "" (the default): the pool uses the default key (`fabric`).
    gangTopologyKey = StrictRegexField(
        TOPOLOGY_KEY_REGEX,
        max_length=128,
        required=False,
        allow_blank=True,
        default="",
        source="gang_topology_key",
    )


class PoolInput(StrictSerializer):
    poolId = pool_id_field()


class PoolUpdateInput(PoolInput):
    name = StrictRegexField(POOL_NAME_RE.pattern, max_length=128, required=False)
    gpuModel = StrictCharField(max_length=64, required=False, allow_blank=True, source="gpu_model")
    sharing = serializers.ChoiceField(choices=Sharing.values, required=False)
    slotsPerGpu = StrictIntegerField(
        min_value=1, max_value=64, required=False, allow_null=True, source="slots_per_gpu"
    )
    noticeSeconds = StrictIntegerField(min_value=0, max_value=86400, required=False, source="notice_seconds")
    labels = LabelsField(required=False)
    # "" goes back to the default (`fabric`).
    gangTopologyKey = StrictRegexField(
        TOPOLOGY_KEY_REGEX, max_length=128, required=False, allow_blank=True, source="gang_topology_key"
    )


class PoolListInput(StrictSerializer):
    ownerTenantId = tenant_id_field(source="owner_id", required=False)
    archived = StrictBooleanField(required=False, allow_null=True, default=None)
    limit = StrictIntegerField(min_value=1, max_value=LIST_MAX, required=False, default=LIST_DEFAULT)
    cursor = pool_id_field(source=None, required=False)


class PoolOutput(serializers.Serializer):
    # The fields in the order `pool_payload` answers them. (A comment, not a
    # docstring: the OpenAPI document would show a docstring.)
    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            **_strings("poolId", "ownerTenantId", "name", "gpuModel", "sharing"),
            "slotsPerGpu": serializers.IntegerField(allow_null=True),
            "noticeSeconds": serializers.IntegerField(),
            "labels": serializers.DictField(child=serializers.CharField()),
            "gangTopologyKey": serializers.CharField(),
            "archived": serializers.BooleanField(),
            "archivedAt": serializers.IntegerField(allow_null=True),
            "apiChangedAt": serializers.IntegerField(allow_null=True),
        }


class PoolListOutput(serializers.Serializer):
    pools = PoolOutput(many=True)
    nextCursor = serializers.CharField(allow_null=True)


class OfferingInput(StrictSerializer):
    poolId = pool_id_field()
    tenantId = tenant_id_field()


class OfferingCreateInput(OfferingInput):
    quota = QuotaField(allow_remove=False, required=False, default=dict)
    quotaMode = serializers.ChoiceField(choices=QuotaMode.values, required=False, source="quota_mode")


class OfferingUpdateInput(OfferingInput):
    quota = QuotaField(allow_remove=True, required=False, default=dict)
    quotaMode = serializers.ChoiceField(choices=QuotaMode.values, required=False, source="quota_mode")


class OfferingListInput(StrictSerializer):
    tenantId = tenant_id_field(required=False)
    poolId = pool_id_field(required=False)


class QuotaRowOutput(serializers.Serializer):
    resource = serializers.CharField()
    max = serializers.IntegerField()
    used = serializers.IntegerField()
    # A plain string here (`counter` or `concurrent`): the input's `quotaMode` documents the choice.
    mode = serializers.CharField(help_text="counter or concurrent")


class OfferingOutput(serializers.Serializer):
    poolId = serializers.CharField()
    poolName = serializers.CharField()
    ownerTenantId = serializers.CharField()
    tenantId = serializers.CharField()
    quota = QuotaRowOutput(many=True)


class OfferingListOutput(serializers.Serializer):
    offerings = OfferingOutput(many=True)


class WithdrawnOutput(serializers.Serializer):
    poolId = serializers.CharField()
    tenantId = serializers.CharField()
    withdrawn = serializers.BooleanField()


# --- nodes ------------------------------------------------------------------------------------

REASON_MAX = 1000


def _reason(*, required: bool) -> StrictCharField:
    if required:
        return StrictCharField(max_length=REASON_MAX, trim_whitespace=True)
    return StrictCharField(max_length=REASON_MAX, required=False, allow_blank=True, default="")


# `{nodeId}`: the body of `nodes/get`, and the start of every node operation's
# body. An operation's other fields are named as its `operations.services`
# action's keyword arguments: `operations.api.nodes` passes them on as they are.
# (No docstring: the OpenAPI document describes these inputs by StrictSerializer's.)
class NodeInput(StrictSerializer):
    nodeId = node_id_field()


class NodeGetInput(NodeInput):
    pass


class CordonInput(NodeInput):
    reason = _reason(required=True)


class UncordonInput(NodeInput):
    reason = _reason(required=False)


class TaintInput(NodeInput):
    key = StrictCharField(max_length=253)
    value = StrictCharField(max_length=253, required=False, allow_blank=True, default="")
    effect = serializers.ChoiceField(choices=TaintEffect.values)
    reason = _reason(required=False)


class UntaintInput(NodeInput):
    key = StrictCharField(max_length=253)
    reason = _reason(required=False)


class SetMaintenanceInput(NodeInput):
    on = StrictBooleanField()
    reason = _reason(required=False)


class SetHealthInput(StrictSerializer):
    deviceUid = StrictCharField(max_length=255, source="device_uid")
    healthy = StrictBooleanField()
    reason = _reason(required=False)


class NodeListInput(StrictSerializer):
    poolId = pool_id_field(required=False)
    bucket = serializers.ChoiceField(choices=NODE_BUCKETS, required=False)
    hostnamePrefix = StrictCharField(max_length=253, required=False, source="hostname_prefix")
    # DRF's metaclass takes declared fields off the class, so this does not shadow
    # `Field.label` at run time; mypy only sees the class body.
    label = StrictCharField(  # type: ignore[assignment]
        max_length=512, required=False, help_text="`key=value` (that value) or `key` (any value)"
    )
    limit = StrictIntegerField(
        min_value=1, max_value=NODE_LIST_MAX, required=False, default=NODE_LIST_DEFAULT
    )
    cursor = StrictCharField(max_length=1024, required=False, allow_null=True)


class NodeReportField(serializers.JSONField):
    """A node report: an object here, parsed whole by `inventory.reports.report_parse` in the service."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be a JSON object")
        return super().to_internal_value(data)

    openapi_component = "NodeReport"

    def openapi_schema(self) -> dict[str, Any]:
        return report_schema()


class ReportInput(StrictSerializer):
    nodeId = node_id_field()
    report = NodeReportField(help_text="a node report (fleet.md); its format is checked field by field")


class DeviceSerializer(serializers.Serializer):
    uid = serializers.CharField()
    nodeId = serializers.CharField()
    parentUid = serializers.CharField(allow_null=True)
    attributes = serializers.DictField()
    healthy = serializers.BooleanField()
    bookable = serializers.BooleanField(help_text="a bookable device is an atom")
    vanishedAt = serializers.IntegerField(allow_null=True, help_text="milliseconds since the epoch")


# The API's field is `class`, a Python keyword: declared after the class body.
DeviceSerializer._declared_fields["class"] = serializers.ChoiceField(choices=DeviceClass.values)


class TaintSerializer(serializers.Serializer):
    key = serializers.CharField()
    value = serializers.CharField()
    effect = serializers.ChoiceField(choices=TaintEffect.values)
    reason = serializers.CharField()
    createdBy = serializers.CharField()
    createdAt = serializers.IntegerField()


class NodeResourceSerializer(serializers.Serializer):
    resource = serializers.CharField()
    allocatable = serializers.IntegerField()
    ratio = serializers.FloatField(help_text="overcommit ratio; claims fit floor(allocatable * ratio)")
    allocated = serializers.IntegerField()


class NodeSerializer(serializers.Serializer):
    # The fields in the order `node_detail` answers them: who the node is, its
    # state (each operator's flag with its reason), then what it holds.
    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            **_strings("id", "hostname", "poolId", "role", "trust"),
            "ownerTenantId": serializers.CharField(allow_null=True),
            **_strings("provisionState", "connectivity"),
            "maintenance": serializers.BooleanField(),
            "maintenanceReason": serializers.CharField(),
            "cordoned": serializers.BooleanField(),
            **_strings("cordonReason", "cordonedBy"),
            "cordonedAt": serializers.IntegerField(allow_null=True),
            "noScheduleTaints": serializers.IntegerField(),
            "convergedSpecs": serializers.IntegerField(),
            "labels": serializers.DictField(child=serializers.CharField()),
            "lastHeartbeatAt": serializers.IntegerField(allow_null=True),
            "bucket": serializers.ChoiceField(choices=NODE_BUCKETS),
            "schedulable": serializers.BooleanField(),
            "taints": TaintSerializer(many=True),
            "resources": NodeResourceSerializer(many=True),
            "atoms": DeviceSerializer(many=True),
            "updatedAt": serializers.IntegerField(),
        }


class NodeListItem(NodeSerializer):
    # A list answers the nodes without their atoms.
    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        del fields["atoms"]
        return fields


class NodeListOutput(serializers.Serializer):
    nodes = NodeListItem(many=True)
    nextCursor = serializers.CharField(allow_null=True)


class ReportOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    devices = DeviceSerializer(many=True)
