"""The reservation request: one validator for `reservations/create` and `capacity/preview`.

`parse_reservation_request` turns a JSON body into a
`reservations.request_types.ReservationRequest` or raises `InvalidInput`
naming every bad field (`devices[0].count`). The view layer uses
`ReservationRequestSerializer` only for the OpenAPI document and for
`rpc_input`-style validation; the placer and the services take the dataclass.

Rules beyond the seeds' field table, decided here:

* `sharing` must fit the class (`gpu` exclusive, `gpu.mig` mig, `gpu.slot`
  timeslice or mps); `nic.vf`, `disk` and `node` atoms are never shared, so
  only `exclusive` (or nothing) is accepted for them. When `sharing` is left
  out it is filled from the class where only one mode fits.
* `topology: nvlink-all` on an item only makes sense for GPU classes.
* A `node` atom is the whole node, one per node: its count must be 1.
* `gang.topologyKey` defaults to `fabric` (gangs book nodes on one fabric).
* `resources` claims of 0 are dropped: a zero claim takes nothing.
* A `start` more than 5 minutes before `compute_now()` is refused; a start up
  to 5 minutes in the past, or at now, is "now" (`start_ms` None), so a client
  whose clock runs a little behind is not punished.
* A `start` more than `CAPACITY_MAX_START_AHEAD` seconds (default 365 days)
  after `compute_now()` is refused too (the horizon), so a booking ends at most
  the horizon plus the longest duration (366 days) ahead.
* The pool's sharing mode is not known from the body: `reservations.validation`
  calls `check_request_against_pool` once it holds the pool, for both methods.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import (
    StrictBooleanField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    _flatten,
    pool_id_field,
    tenant_id_field,
)
from core.constants import MAX_TIME_MS, NODE_ID_REGEX, PROJECT_ID_REGEX
from core.durations import DurationError, parse_duration
from core.errors import InvalidInput
from reservations.request_types import DeviceRequest, ReservationRequest
from reservations.selectors_parse import selector_errors

if TYPE_CHECKING:
    from inventory.models import Pool

DEVICE_CLASSES = ("gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node")
GPU_CLASSES = frozenset({"gpu", "gpu.mig", "gpu.slot"})
SHARING_MODES = ("exclusive", "mig", "timeslice", "mps")
TOPOLOGIES = ("any", "nvlink-all")
BINDINGS = ("hold", "node")
# The sharing modes an atom of each class can be booked under (model.md, "Placement").
CLASS_SHARING: dict[str, tuple[str, ...]] = {
    "gpu": ("exclusive",),
    "gpu.mig": ("mig",),
    "gpu.slot": ("timeslice", "mps"),
    "nic.vf": ("exclusive",),
    "disk": ("exclusive",),
    "node": ("exclusive",),
}
IDEMPOTENCY_KEY_REGEX = r"^[A-Za-z0-9._:-]{1,128}$"
NODE_PROFILE_REGEX = r"^[A-Za-z0-9._:/-]{1,128}$"
# How far in the past a start may be and still be read as "now".
START_GRACE_MS = 5 * 60 * 1000
DEFAULT_GANG_TOPOLOGY_KEY = "fabric"


def start_horizon_seconds() -> int:
    """How far after `compute_now()` a booking may start (`CAPACITY_MAX_START_AHEAD`)."""
    from django.conf import settings

    return int(settings.CAPACITY_MAX_START_AHEAD)


def start_horizon_message(seconds: int) -> str:
    """The refusal of a start past the horizon, in the largest whole unit (`365 days`)."""
    unit, amount = "second", seconds
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            unit, amount = name, seconds // size
            break
    return f"must not be more than {amount} {unit}{'' if amount == 1 else 's'} ahead"


def _int(lo: int, hi: int, **kwargs: Any) -> StrictIntegerField:
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


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string"}], "example": "1h30m"})
class DurationField(serializers.Field):
    """Seconds, or a duration string (`90s`, `1h30m`, `1d`, `PT8H`); 60 s to 366 days."""

    def to_internal_value(self, data: Any) -> int:
        try:
            return parse_duration(data)
        except DurationError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": True,
        "description": "attribute → value (equality) or one operator object: eq, ne, gt, gte, lt, lte, "
        "in, notIn, exists",
        "example": {"vramGiB": {"gte": 80}, "gpuModel": "H100"},
    }
)
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
    count = _int(1, 64)
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

    vcpu = _int(0, 4096, required=False)
    memoryGiB = _int(0, 65536, required=False)
    hugepages1Gi = _int(0, 4096, required=False)


class NodeProfileSerializer(_RequestPart):
    """The node profile the reservation's workload runs under."""

    profileId = StrictRegexField(NODE_PROFILE_REGEX, max_length=128)
    profileVersion = _int(1, 2**31 - 1, required=False)


class WaitSerializer(_RequestPart):
    """How long a create that does not fit may wait for a release."""

    timeoutMs = _int(0, 30000)


class GangSerializer(_RequestPart):
    """`size` nodes sharing one value of the node label `topologyKey` (default `fabric`)."""

    size = _int(2, 64)
    topologyKey = StrictRegexField(r"^\S{1,128}$", max_length=128, required=False)


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
    start = _int(0, MAX_TIME_MS, required=False, allow_null=True)
    duration = DurationField()
    binding = _choice(BINDINGS, required=False)
    resources = ResourcesSerializer(required=False)
    node = NodeProfileSerializer(required=False, allow_null=True)
    leaseSeconds = _int(30, 86400, required=False, allow_null=True)
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


def _invalid(detail: Any) -> InvalidInput:
    # One message per field: a too-long id breaks both its length and its
    # pattern, and saying so twice helps nobody.
    details: list[dict[str, str]] = []
    for item in _flatten(detail):
        if all(seen["field"] != item["field"] for seen in details):
            details.append(item)
    return InvalidInput.from_details(details)


class ExplainNodeInput(serializers.Serializer):
    """`capacity/explain`'s own field: the one node to explain."""

    nodeId = StrictRegexField(NODE_ID_REGEX, max_length=57)


class ExplainInput(ReservationRequestSerializer):
    """The body of `capacity/explain`: a preview's, and optionally one node (for the OpenAPI document)."""

    nodeId = StrictRegexField(NODE_ID_REGEX, max_length=57, required=False)


# capacity/earliest searches at most this far, and a week when the body does not say.
EARLIEST_HORIZON_MAX_SECONDS = 30 * 86400
EARLIEST_HORIZON_DEFAULT_SECONDS = 7 * 86400


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string"}], "example": "7d"})
class HorizonField(serializers.Field):
    """How far past `from` capacity/earliest may start the request: seconds or a duration string."""

    def to_internal_value(self, data: Any) -> int:
        try:
            return parse_duration(data, minimum=0, maximum=EARLIEST_HORIZON_MAX_SECONDS)
        except DurationError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: Any) -> Any:
        return value


class EarliestSearchInput(StrictSerializer):
    """`capacity/earliest`'s own fields: where the search starts and how far it goes."""

    # `from` is a Python keyword: the field is declared under its JSON name below.
    horizon = HorizonField(
        required=False,
        help_text="seconds or a duration string (`7d`, `36h`); at most 30 days; default 7 days",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = _int(
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

    horizon = HorizonField(required=False, help_text=EarliestSearchInput().fields["horizon"].help_text)

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
        raise _invalid(serializer.errors)
    return body, dict(serializer.validated_data)


def parse_reservation_request(data: dict[str, Any], *, now_ms: int | None = None) -> ReservationRequest:
    """Validate a reservation body into a ReservationRequest; InvalidInput names every bad field.

    `now_ms` is for callers that already asked `compute_now()`; otherwise it is
    asked only when the body has a `start`.
    """
    context: dict[str, Any] = {} if now_ms is None else {"now_ms": now_ms}
    serializer = ReservationRequestSerializer(data=data, context=context)
    if not serializer.is_valid():
        raise _invalid(serializer.errors)
    v = serializer.validated_data
    start_ms = v.get("start")
    if start_ms is not None and start_ms <= serializer._now_ms():
        start_ms = None  # up to 5 minutes late: now
    devices = tuple(
        DeviceRequest(
            device_class=item["class"],
            count=item["count"],
            selector=item.get("selector") or {},
            topology=item.get("topology") or "any",
            # Where the class allows one mode only, say it, so an explicit
            # `sharing` and a left-out one are the same request.
            sharing=item.get("sharing") or _only_mode(item["class"]),
        )
        for item in v["devices"]
    )
    gang = v.get("gang")
    wait = v.get("wait")
    node = v.get("node")
    return ReservationRequest(
        tenant_id=v["tenant_id"],
        pool_id=v["pool_id"],
        devices=devices,
        duration_seconds=v["duration"],
        idempotency_key=v["idempotencyKey"],
        project_id=v.get("projectId"),
        topology=v.get("topology") or "any",
        start_ms=start_ms,
        binding=v.get("binding") or "hold",
        resources={name: amount for name, amount in (v.get("resources") or {}).items() if amount},
        node_profile=dict(node) if node else None,
        lease_seconds=v.get("leaseSeconds"),
        spot=bool(v.get("spot", False)),
        wait_timeout_ms=wait["timeoutMs"] if wait else 0,
        gang_size=gang["size"] if gang else None,
        gang_topology_key=(gang.get("topologyKey") or DEFAULT_GANG_TOPOLOGY_KEY) if gang else None,
        raw=copy.deepcopy(dict(data)),
    )


def _only_mode(device_class: str) -> str | None:
    modes = CLASS_SHARING[device_class]
    return modes[0] if len(modes) == 1 else None


def check_request_against_pool(request: ReservationRequest, pool: Pool) -> None:
    """Refuse device items the pool's sharing mode can never serve (INVALID_INPUT, by field).

    An exclusive pool has whole `gpu` atoms, a `mig` pool `gpu.mig` atoms, a
    `timeslice`/`mps` pool `gpu.slot` atoms; non-GPU classes fit any pool. The
    error names `devices[i].sharing` when the client chose a mode, else
    `devices[i].class`.
    """
    raw_devices = request.raw.get("devices") if isinstance(request.raw, Mapping) else None
    details: list[dict[str, str]] = []
    for index, item in enumerate(request.devices):
        if item.device_class not in GPU_CLASSES:
            continue
        modes = CLASS_SHARING[item.device_class]
        if pool.sharing in modes and item.sharing in (None, pool.sharing):
            continue
        explicit = (
            isinstance(raw_devices, list)
            and index < len(raw_devices)
            and isinstance(raw_devices[index], Mapping)
            and raw_devices[index].get("sharing") is not None
        )
        if pool.sharing in modes:
            message = f"the pool is {pool.sharing}, not {item.sharing}"
        else:
            message = (
                f"the pool is {pool.sharing}; class {item.device_class} needs a {' or '.join(modes)} pool"
            )
        field = f"devices[{index}].{'sharing' if explicit else 'class'}"
        details.append({"field": field, "message": message})
    if details:
        raise InvalidInput.from_details(details)


def canonical_request(request: ReservationRequest) -> dict[str, Any]:
    """The request's meaning as plain JSON: defaults filled in, order that does not matter removed.

    `start` is the client's value, not the "now" it may have been read as, so
    a retry a minute later has the same digest. `wait` is how long this call
    may block, not part of what is reserved, so it is left out.
    """
    raw_start = request.raw.get("start") if isinstance(request.raw, Mapping) else None
    devices = [
        {
            "class": item.device_class,
            "count": item.count,
            "selector": {name: dict(ops) for name, ops in sorted(item.selector.items())},
            "topology": item.topology,
            "sharing": item.sharing,
        }
        for item in request.devices
    ]
    devices.sort(key=lambda item: json.dumps(item, sort_keys=True))
    return {
        "tenantId": request.tenant_id,
        "poolId": request.pool_id,
        "projectId": request.project_id,
        "devices": devices,
        "topology": request.topology,
        "start": raw_start,
        "durationSeconds": request.duration_seconds,
        "binding": request.binding,
        "resources": dict(sorted(request.resources.items())),
        "node": request.node_profile,
        "leaseSeconds": request.lease_seconds,
        "spot": request.spot,
        "idempotencyKey": request.idempotency_key,
        "gang": {"size": request.gang_size, "topologyKey": request.gang_topology_key}
        if request.gang_size is not None
        else None,
    }


def canonical_request_digest(request: ReservationRequest) -> str:
    """SHA-256 of the canonical request: equal for bodies that ask for the same reservation."""
    text = json.dumps(canonical_request(request), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
