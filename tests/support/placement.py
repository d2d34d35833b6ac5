"""Nodes to place on and reservation requests, as the placer and the services take them."""

from __future__ import annotations

import itertools
from typing import Any

from inventory.models import Node, Pool
from reservations.request.types import DeviceRequest, ReservationRequest
from tests.support.factories import DeviceFactory, NodeFactory, NodeResourceFactory

_keys = itertools.count()


def make_node(
    pool: Pool,
    *,
    gpus: int = 8,
    numa_split: int = 4,
    nvlink: list[str] | None = None,
    vram: int = 80,
    labels: dict[str, str] | None = None,
    node_atom: bool = False,
    resources: dict[str, int] | None = None,
    **node_fields: Any,
) -> Node:
    """A node with `gpus` whole GPUs: the first `numa_split` on NUMA 0, the rest on NUMA 1."""
    node = NodeFactory(pool=pool, labels=labels or {"fabric": "ib-1", "rack": "r01"}, **node_fields)
    for index in range(gpus):
        attributes: dict[str, Any] = {
            "gpuProduct": "NVIDIA H100 80GB HBM3",
            "gpuModel": "H100",
            "vramGiB": vram,
            "numaNode": 0 if index < numa_split else 1,
        }
        if nvlink:
            attributes["nvlinkDomain"] = nvlink[index]
        DeviceFactory(node=node, uid=f"GPU-{node.hostname}-{index}", attributes=attributes)
    if node_atom:
        DeviceFactory(node=node, uid=node.id, device_class="node", attributes={})
    for resource, amount in (resources or {}).items():
        NodeResourceFactory(node=node, resource=resource, allocatable=amount)
    return node


def gpu_request(pool: Pool, count: int = 1, **fields: Any) -> ReservationRequest:
    """A request for `count` devices (whole GPUs unless `device_class` says otherwise) for an hour."""
    selector = fields.pop("selector", {})
    topology = fields.pop("item_topology", "any")
    device_class = fields.pop("device_class", "gpu")
    fields.setdefault("tenant_id", pool.owner_id)
    fields.setdefault("duration_seconds", 3600)
    fields.setdefault("idempotency_key", f"k-{next(_keys)}")
    return ReservationRequest(
        pool_id=pool.id,
        devices=(
            DeviceRequest(device_class=device_class, count=count, selector=selector, topology=topology),
        ),
        **fields,
    )
