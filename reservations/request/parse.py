"""The reservation request: one validator for `reservations/create` and `capacity/preview`.

`parse_reservation_request` turns a JSON body into a
`reservations.request.types.ReservationRequest` or raises `InvalidInput`
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
* The pool's sharing mode is not known from the body: `reservations.request.resolve`
  calls `check_request_against_pool` once it holds the pool, for both methods.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core.api.envelope import _flatten
from core.errors import InvalidInput
from reservations.request.serializers import ReservationRequestSerializer
from reservations.request.types import (
    DEFAULT_GANG_TOPOLOGY_KEY,
    GPU_CLASSES,
    DeviceRequest,
    ReservationRequest,
)

if TYPE_CHECKING:
    from inventory.models import Pool

# The sharing modes an atom of each class can be booked under (model.md, "Placement").
CLASS_SHARING: dict[str, tuple[str, ...]] = {
    "gpu": ("exclusive",),
    "gpu.mig": ("mig",),
    "gpu.slot": ("timeslice", "mps"),
    "nic.vf": ("exclusive",),
    "disk": ("exclusive",),
    "node": ("exclusive",),
}


def invalid_input(detail: Any) -> InvalidInput:
    # One message per field: a too-long id breaks both its length and its
    # pattern, and saying so twice helps nobody.
    details: list[dict[str, str]] = []
    for item in _flatten(detail):
        if all(seen["field"] != item["field"] for seen in details):
            details.append(item)
    return InvalidInput.from_details(details)


def parse_reservation_request(data: dict[str, Any], *, now_ms: int | None = None) -> ReservationRequest:
    """Validate a reservation body into a ReservationRequest; InvalidInput names every bad field.

    `now_ms` is for callers that already asked `compute_now()`; otherwise it is
    asked only when the body has a `start`.
    """
    context: dict[str, Any] = {} if now_ms is None else {"now_ms": now_ms}
    serializer = ReservationRequestSerializer(data=data, context=context)
    if not serializer.is_valid():
        raise invalid_input(serializer.errors)
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
