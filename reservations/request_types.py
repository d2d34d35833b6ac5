"""The validated reservation request, as the placer and the services take it.

`reservations.request` turns an API body (or CLI arguments) into these; the
placer and `reservation_create` never see raw JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
