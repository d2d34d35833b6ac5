"""Input and output of the node operations (`nodes/*`, `devices/setHealth`) and `inventory/report`."""

from __future__ import annotations

from rest_framework import serializers

from core.api import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    node_id_field,
    pool_id_field,
)
from inventory.models import TaintEffect
from inventory.schedulability import BUCKETS, EXCLUDED, SCHEDULABLE
from inventory.selectors import NODE_LIST_DEFAULT, NODE_LIST_MAX

REASON_MAX = 1000


def _reason(*, required: bool) -> StrictCharField:
    if required:
        return StrictCharField(max_length=REASON_MAX, trim_whitespace=True)
    return StrictCharField(max_length=REASON_MAX, required=False, allow_blank=True, default="")


# `{nodeId}`: the body of `nodes/get`, and the start of every node operation's
# body. An operation's other fields are named as its `inventory.services.nodes`
# service's keyword arguments: `operations.api.nodes` passes them on as they are.
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
    bucket = serializers.ChoiceField(choices=[SCHEDULABLE, *BUCKETS, EXCLUDED], required=False)
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


class ReportInput(StrictSerializer):
    nodeId = node_id_field()
    report = serializers.JSONField(help_text="a node report; its format is checked field by field")

    def validate_report(self, value: object) -> object:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value


class DeviceSerializer(serializers.Serializer):
    uid = serializers.CharField()
    nodeId = serializers.CharField()
    parentUid = serializers.CharField(allow_null=True)
    attributes = serializers.DictField()
    healthy = serializers.BooleanField()
    bookable = serializers.BooleanField(help_text="a bookable device is an atom")
    vanishedAt = serializers.IntegerField(allow_null=True, help_text="milliseconds since the epoch")


# The API's field is `class`, a Python keyword: declared after the class body.
DeviceSerializer._declared_fields["class"] = serializers.ChoiceField(
    choices=["gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node"]
)


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
    id = serializers.CharField()
    hostname = serializers.CharField()
    poolId = serializers.CharField()
    role = serializers.CharField()
    trust = serializers.CharField()
    ownerTenantId = serializers.CharField(allow_null=True)
    provisionState = serializers.CharField()
    connectivity = serializers.CharField()
    maintenance = serializers.BooleanField()
    maintenanceReason = serializers.CharField()
    cordoned = serializers.BooleanField()
    cordonReason = serializers.CharField()
    cordonedBy = serializers.CharField()
    cordonedAt = serializers.IntegerField(allow_null=True)
    noScheduleTaints = serializers.IntegerField()
    convergedSpecs = serializers.IntegerField()
    labels = serializers.DictField(child=serializers.CharField())
    lastHeartbeatAt = serializers.IntegerField(allow_null=True)
    bucket = serializers.ChoiceField(
        choices=["schedulable", "provisioning", "maintenance", "unreachable", "unhealthy", "excluded"]
    )
    schedulable = serializers.BooleanField()
    taints = TaintSerializer(many=True)
    resources = NodeResourceSerializer(many=True)
    atoms = DeviceSerializer(many=True)
    updatedAt = serializers.IntegerField()


class NodeListItem(NodeSerializer):
    atoms = None  # type: ignore[assignment]  # a list answers the nodes without their atoms


class NodeListOutput(serializers.Serializer):
    nodes = NodeListItem(many=True)
    nextCursor = serializers.CharField(allow_null=True)


class ReportOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    devices = DeviceSerializer(many=True)
