"""The reservation request's body: one DRF serializer for `reservations/create` and `capacity/preview`.

`reservations.request.parse.parse_reservation_request` validates a body with
`ReservationRequestSerializer` and turns it into the dataclass the placer and
the services take; the views name it for the OpenAPI document. Unknown fields
are reported with every other bad field, and every message reads as the
contract's.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.fields import (
    DurationField,
    StrictBooleanField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    pool_id_field,
    tenant_id_field,
)
from core.api.schema import Rule
from core.constants import MAX_TIME_MS, PROJECT_ID_REGEX, TOPOLOGY_KEY_REGEX
from inventory.choices import CLASS_SHARING
from reservations.request.device_match import selector_errors, selector_schema
from reservations.request.types import (
    BINDINGS,
    DEVICE_CLASSES,
    GPU_CLASSES,
    IDEMPOTENCY_KEY_REGEX,
    NODE_PROFILE_REGEX,
    SHARING_MODES,
    START_GRACE_MS,
    TOPOLOGIES,
    start_horizon_message,
    start_horizon_seconds,
)

# What a schema-valid reservation request may still be refused for: the method's `x-rules`.
ITEM_RULES = (
    Rule(
        ("devices[].sharing",),
        "an item's `sharing` is one its class is booked as: `gpu` exclusive, `gpu.mig` mig, `gpu.slot` "
        "timeslice or mps, other classes exclusive; for a GPU class, the pool's own mode",
    ),
    Rule(
        ("devices[].class",),
        "a GPU class is one the pool's sharing mode serves: `gpu` in an exclusive pool, `gpu.mig` in a "
        "mig pool, `gpu.slot` in a timeslice or mps pool",
    ),
    Rule(("devices[].topology",), "`nvlink-all` applies to GPU classes only"),
    Rule(("devices[].count",), "a `node` item's count is 1"),
    Rule(("duration",), "a duration string's value is 60 seconds to 366 days, as the integer's"),
)
START_RULE = Rule(
    ("start",),
    "`start` is at most 5 minutes before now (a start a little in the past is now) and at most the "
    "booking horizon (365 days by default) after it",
)
RESERVATION_REQUEST_RULES = (*ITEM_RULES, START_RULE)


def bounded_int(lo: int, hi: int, **kwargs: Any) -> StrictIntegerField:
    """An integer field whose range message reads as the contract's (`must be between 1 and 64`)."""
    message = f"must be between {lo} and {hi}"
    return StrictIntegerField(
        min_value=lo,
        max_value=hi,
        error_messages={"min_value": message, "max_value": message, "invalid": "must be an integer"},
        **kwargs,
    )


def _choice(choices: tuple[str, ...], **kwargs: Any) -> serializers.ChoiceField:
    return _StrictChoiceField(
        choices=choices,
        error_messages={"invalid_choice": f"must be one of {', '.join(choices)}"},
        **kwargs,
    )


class _StrictChoiceField(serializers.ChoiceField):
    """A JSON string among the choices; DRF would match `1` against `"1"`."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class SelectorField(serializers.Field):
    """A selector in the API's object form, normalized and typed against the attribute registry."""

    def to_internal_value(self, data: Any) -> Any:
        selector, errors = selector_errors(data)
        if errors:
            whole = errors.pop("", None)
            if whole is not None:
                raise serializers.ValidationError(whole)
            # Keyed by attribute, so the envelope says `devices[0].selector.vramGiB`.
            raise serializers.ValidationError({name: [message] for name, message in errors.items()})
        return selector

    def to_representation(self, value: Any) -> Any:
        return value

    openapi_component = "Selector"

    def openapi_schema(self) -> dict[str, Any]:
        return selector_schema()


class _RequestPart(StrictSerializer):
    """Strict, and unknown fields are reported together with every other bad field."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            return super().to_internal_value(data)
        unknown = {name: ["unknown field"] for name in sorted(set(data) - set(self.fields))}
        try:
            value = super().to_internal_value({k: v for k, v in data.items() if k in self.fields})
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class DeviceItemSerializer(_RequestPart):
    """One kind of atom the reservation takes: `{class, count, selector?, topology?, sharing?}`."""

    # `class` is a Python keyword: the field is declared under its JSON name below.
    count = bounded_int(1, 64)
    selector = SelectorField(required=False)
    topology = _choice(TOPOLOGIES, required=False)
    sharing = _choice(SHARING_MODES, required=False)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {"class": _choice(DEVICE_CLASSES), **fields}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        device_class = attrs["class"]
        errors: dict[str, list[str]] = {}
        sharing = attrs.get("sharing")
        modes = CLASS_SHARING[device_class]
        if sharing is not None and sharing not in modes:
            errors["sharing"] = [f"class {device_class} is booked as {' or '.join(modes)}, not {sharing}"]
        if attrs.get("topology") == "nvlink-all" and device_class not in GPU_CLASSES:
            errors["topology"] = [f"nvlink-all applies to GPU classes, not {device_class}"]
        if device_class == "node" and attrs["count"] != 1:
            errors["count"] = ["a node has one node atom: count must be 1"]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class ResourcesSerializer(_RequestPart):
    """Host resources booked with the devices, on each node."""

    vcpu = bounded_int(0, 4096, required=False)
    memoryGiB = bounded_int(0, 65536, required=False)
    hugepages1Gi = bounded_int(0, 4096, required=False)


class NodeProfileSerializer(_RequestPart):
    """The node profile the reservation's workload runs under."""

    profileId = StrictRegexField(NODE_PROFILE_REGEX, max_length=128)
    profileVersion = bounded_int(1, 2**31 - 1, required=False)


class WaitSerializer(_RequestPart):
    """How long a create that does not fit may wait for a release."""

    timeoutMs = bounded_int(0, 30000)


class GangSerializer(_RequestPart):
    """`size` nodes sharing one value of the node label `topologyKey` (default `fabric`)."""

    size = bounded_int(2, 64)
    topologyKey = StrictRegexField(TOPOLOGY_KEY_REGEX, max_length=128, required=False)


class ReservationRequestSerializer(_RequestPart):
    """The body of `reservations/create` and `capacity/preview` (the seeds' preview table)."""

    tenantId = tenant_id_field()
    poolId = pool_id_field()
    projectId = StrictRegexField(PROJECT_ID_REGEX, max_length=56, required=False, allow_null=True)
    devices = DeviceItemSerializer(  # type: ignore[call-arg]  # many=True passes these to the list
        many=True,
        min_length=1,
        max_length=8,
        error_messages={"min_length": "must have 1 to 8 items", "max_length": "must have 1 to 8 items"},
        help_text="1-8 items",
    )
    topology = _choice(TOPOLOGIES, required=False)
    start = bounded_int(0, MAX_TIME_MS, required=False, allow_null=True)
    duration = DurationField()
    binding = _choice(BINDINGS, required=False)
    resources = ResourcesSerializer(required=False)
    node = NodeProfileSerializer(required=False, allow_null=True)
    leaseSeconds = bounded_int(30, 86400, required=False, allow_null=True)
    spot = StrictBooleanField(required=False)
    idempotencyKey = StrictRegexField(IDEMPOTENCY_KEY_REGEX, max_length=128)
    wait = WaitSerializer(required=False, allow_null=True)
    gang = GangSerializer(required=False, allow_null=True)

    def validate_start(self, value: int | None) -> int | None:
        if value is None:
            return None
        now_ms = self._now_ms()
        if value < now_ms - START_GRACE_MS:
            raise serializers.ValidationError("must not be more than 5 minutes in the past")
        horizon = start_horizon_seconds()
        if value > now_ms + horizon * 1000:
            raise serializers.ValidationError(start_horizon_message(horizon))
        return value

    def _now_ms(self) -> int:
        """`compute_now()` in ms, asked once and only when a start is given."""
        now_ms = self.context.get("now_ms")
        if now_ms is None:
            from core.clock import compute_now, to_millis

            now_ms = to_millis(compute_now())
            self.context["now_ms"] = now_ms
        assert now_ms is not None
        return int(now_ms)
