"""The node agent's methods' bodies: `nodes/register`, `heartbeat`, `assignments`, `ack`."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    pool_id_field,
)
from operations.api.serializers import LabelsField, NodeInput
from reservations.models import DeliveryKind

# The longest a long poll waits for a change before it answers with none.
MAX_WAIT_MS = 30_000
MAX_DELIVERY_ID = 2**63 - 1
# A placement's bounds: more CPUs than any host has, NUMA node and CPU numbers as Linux counts them.
MAX_PLACEMENT_CPUS = 4096
MAX_PLACEMENT_NUMA_NODES = 1024
MAX_CPU_NUMBER = 65535


class RegisterInput(StrictSerializer):
    poolId = pool_id_field()
    hostname = StrictCharField(max_length=253)
    labels = LabelsField(required=False, default=dict)


class RegisterOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    poolId = serializers.CharField()
    hostname = serializers.CharField()
    created = serializers.BooleanField(help_text="true the first time this hostname registered")
    assignmentsUrl = serializers.CharField(
        help_text="the base URL to long-poll nodes/assignments at; empty: this service's own"
    )


class HeartbeatOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    connected = serializers.BooleanField(
        help_text="false: the node was disconnected; the agent sends a full report to reconnect it"
    )


class AssignmentsInput(NodeInput):
    after = StrictIntegerField(
        min_value=0,
        max_value=MAX_DELIVERY_ID,
        required=False,
        default=0,
        help_text="the last deliveryId applied",
    )
    waitMs = StrictIntegerField(
        min_value=0,
        max_value=MAX_WAIT_MS,
        required=False,
        default=0,
        source="wait_ms",
        help_text="how long to wait for a change when there is none yet",
    )


class ChangeNoticeOutput(serializers.Serializer):
    givenAt = serializers.IntegerField(help_text="when the notice was given, ms since the epoch")
    endsAt = serializers.IntegerField(help_text="when the reservation ends because of it, ms since the epoch")


class ChangeOutput(serializers.Serializer):
    deliveryId = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=DeliveryKind.values)
    reservationId = serializers.CharField()
    start = serializers.IntegerField(
        help_text="ms since the epoch; with end == start, the holding is removed"
    )
    end = serializers.IntegerField()
    atoms = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="assign: atom uids"
    )
    resources = serializers.DictField(child=serializers.IntegerField(), required=False)
    profile = serializers.DictField(allow_null=True, required=False)
    ratios = serializers.DictField(
        child=serializers.FloatField(), required=False, help_text="assign: the overcommit ratio per scalar"
    )
    spot = serializers.BooleanField(
        required=False, help_text="assign: the reservation is spot (it may be given a preemption notice)"
    )
    notice = ChangeNoticeOutput(
        required=False,
        help_text="a spot reservation's preemption notice, once given: the node writes it to the "
        "workload's notice file; its end is the reservation's end",
    )


class AssignmentsOutput(serializers.Serializer):
    nodeId = serializers.CharField()
    connected = serializers.BooleanField(
        help_text="the poll is a heartbeat too; false: the node was disconnected, send a full report first"
    )
    changes = ChangeOutput(many=True)


class NumberSetField(serializers.ListField):
    """Distinct CPU or NUMA node numbers, kept sorted; the schema says `uniqueItems`, as the server checks."""

    def __init__(self, *, max_length: int, **kwargs: Any) -> None:
        super().__init__(
            child=StrictIntegerField(min_value=0, max_value=MAX_CPU_NUMBER), max_length=max_length, **kwargs
        )

    def to_internal_value(self, data: Any) -> list[int]:
        values = super().to_internal_value(data)
        if len(set(values)) != len(values):
            raise serializers.ValidationError("must not repeat a number")
        return sorted(values)

    def openapi_schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_CPU_NUMBER},
            "maxItems": self.max_length,
            "uniqueItems": True,
        }


class PlacementInput(StrictSerializer):
    """What the node gave an assignment's workload: its cgroup's CPUs and NUMA nodes."""

    cpus = NumberSetField(
        max_length=MAX_PLACEMENT_CPUS,
        help_text="the CPUs of the workload's cpuset (Linux CPU numbers), each once",
    )
    numaNodes = NumberSetField(
        max_length=MAX_PLACEMENT_NUMA_NODES,
        help_text="the NUMA nodes of those CPUs (its cpuset.mems), each once",
    )
    gpuLocal = StrictBooleanField(help_text="true when every CPU is on a NUMA node of the booked GPUs")


class AckInput(NodeInput):
    deliveryId = StrictIntegerField(min_value=1, max_value=MAX_DELIVERY_ID, source="delivery_id")
    accepted = StrictBooleanField()
    reason = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")
    placement = PlacementInput(
        required=False,
        help_text="with an accepted `assign`: the CPUs and NUMA nodes the node gave the workload "
        "(`reservations/get` shows it per allocation); refused with `accepted: false`, "
        "ignored on a `shorten`",
    )


class AckOutput(serializers.Serializer):
    deliveryId = serializers.IntegerField()
    accepted = serializers.BooleanField(help_text="the answer recorded (the first one, if answered twice)")
    reason = serializers.CharField()
