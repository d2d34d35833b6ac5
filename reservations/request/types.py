"""The validated reservation request, as the placer and the services take it.

`reservations.request.parse` turns an API body (or CLI arguments) into these; the
placer and `reservation_create` never see raw JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inventory.choices import ATOM_CLASSES, Sharing

# A normalized selector: attribute name -> {operator: value}, operators
# eq, ne, gt, gte, lt, lte, in, notIn, exists; values already type-checked
# against inventory.attributes.
Selector = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class DeviceRequest:
    device_class: str  # gpu, gpu.mig, gpu.slot, nic.vf, disk, node
    count: int
    selector: Selector = field(default_factory=dict)
    topology: str = "any"  # any | nvlink-all
    sharing: str | None = None  # exclusive | mig | timeslice | mps


@dataclass(frozen=True)
class ReservationRequest:
    tenant_id: str
    pool_id: str
    devices: tuple[DeviceRequest, ...]
    duration_seconds: int
    idempotency_key: str
    project_id: str | None = None
    topology: str = "any"
    start_ms: int | None = None  # None: now
    binding: str = "hold"  # hold | node
    resources: dict[str, int] = field(default_factory=dict)  # vcpu, memoryGiB, hugepages1Gi
    node_profile: dict[str, Any] | None = None
    lease_seconds: int | None = None
    spot: bool = False
    wait_timeout_ms: int = 0
    gang_size: int | None = None
    gang_topology_key: str | None = None
    # The body as the client sent it: stored on the reservation, and hashed
    # canonically for idempotency.
    raw: dict[str, Any] = field(default_factory=dict)


DEVICE_CLASSES: tuple[str, ...] = ATOM_CLASSES


GPU_CLASSES = frozenset({"gpu", "gpu.mig", "gpu.slot"})


SHARING_MODES: tuple[str, ...] = tuple(Sharing.values)


TOPOLOGIES = ("any", "nvlink-all")


BINDINGS = ("hold", "node")


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
