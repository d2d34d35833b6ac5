"""`capacity/preview` and `reservations/create` give the same verdict on the same body.

contract.md: both take the same body, "validated the same way". For every
request shape of the seeds' preview table, the body is sent to preview and
then (nothing was written) to create, on one fresh fleet:

* preview `fits: true`  <=> create answers 201;
* preview `fits: false` <=> create answers 409 `NO_CAPACITY`, with the same reason code;
* a preview error        <=> create answers the same status, code and fields.

Each case also names the verdict it should reach, so two endpoints that agree
for the wrong reason (a broken fleet making both 404) still fail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.clock import compute_now, to_millis
from core.models import Tenant
from inventory.models import Node, Pool, Project
from tests.conftest import ClientFor
from tests.support.factories import (
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    PoolFactory,
    ProjectFactory,
    partitioned_gpu,
)

FITS = "fits"
NO_FIT = "no fit"
# A project id the contract's pattern accepts and nobody holds.
UNKNOWN_PROJECT = "prj_" + "0" * 26


@dataclass(frozen=True)
class Fleet:
    """Pools by sharing mode (all owned by acme, `exclusive` offered to beta) and the projects."""

    pools: dict[str, Pool]
    own_project: Project
    foreign_project: Project


def _host(pool: Pool, hostname: str) -> Node:
    """A host with 8 whole H100s on one NVLink domain, 2 NIC VFs, 2 disks, its node atom and scalars."""
    node = NodeFactory.create(pool=pool, hostname=hostname, labels={"fabric": "ib-1", "rack": "r01"})
    for index in range(8):
        DeviceFactory.create(
            node=node,
            uid=f"GPU-{hostname}-{index}",
            attributes={
                "gpuProduct": "NVIDIA H100 80GB HBM3",
                "gpuModel": "H100",
                "vramGiB": 80,
                "numaNode": index // 4,
                "nvlinkDomain": f"nvl-{hostname}",
            },
        )
    for index in range(2):
        DeviceFactory.create(
            node=node, uid=f"VF-{hostname}-{index}", device_class="nic.vf", attributes={"linkGbps": 200}
        )
        DeviceFactory.create(
            node=node,
            uid=f"DISK-{hostname}-{index}",
            device_class="disk",
            attributes={"sizeGiB": 3840, "media": "nvme"},
        )
    DeviceFactory.create(node=node, uid=node.id, device_class="node", attributes={})
    for resource, amount in (("vcpu", 128), ("memoryGiB", 1024), ("hugepages1Gi", 64)):
        NodeResourceFactory.create(node=node, resource=resource, allocatable=amount)
    return node


def _fractional_host(pool: Pool, hostname: str, child_class: str, children: list[dict[str, Any]]) -> Node:
    """A host whose one GPU is not bookable itself, only its MIG instances or slots are."""
    node = NodeFactory.create(pool=pool, hostname=hostname)
    parts = {str(index): attributes for index, attributes in enumerate(children)}
    partitioned_gpu(node, f"GPU-{hostname}-0", child_class, parts)
    return node


@pytest.fixture
def fleet(owner_tenant: Tenant, outsider_tenant: Tenant, owned_pool: Pool) -> Fleet:
    _host(owned_pool, "gpu-x-001")
    _host(owned_pool, "gpu-x-002")
    mig = PoolFactory.create(owner=owner_tenant, name="h100-mig", sharing="mig")
    _fractional_host(mig, "gpu-m-001", "gpu.mig", [{"migProfile": "3g.40gb", "memoryGiB": 40}] * 2)
    pools = {"exclusive": owned_pool, "mig": mig}
    for sharing in ("timeslice", "mps"):
        pool = PoolFactory.create(
            owner=owner_tenant, name=f"l40s-{sharing}", gpu_model="L40S", sharing=sharing, slots_per_gpu=4
        )
        _fractional_host(pool, f"gpu-{sharing}-001", "gpu.slot", [{"slotIndex": k} for k in range(4)])
        pools[sharing] = pool
    hidden = PoolFactory.create(owner=outsider_tenant, name="gamma-only")
    _host(hidden, "gpu-g-001")
    pools["hidden"] = hidden
    return Fleet(
        pools=pools,
        own_project=ProjectFactory.create(tenant=owner_tenant, name="acme-research"),
        foreign_project=ProjectFactory.create(tenant=outsider_tenant, name="gamma-research"),
    )


Body = Callable[[Fleet], dict[str, Any]]


def _no_fields(_fleet: Fleet) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Shape:
    expect: str | tuple[int, str]  # FITS, NO_FIT, or (status, error code)
    devices: list[dict[str, Any]]
    pool: str = "exclusive"
    fields: Body = _no_fields
    tenant: str = "acme"


def _gpu(count: int = 1, **item: Any) -> list[dict[str, Any]]:
    return [{"class": "gpu", "count": count, **item}]


INVALID = (400, "INVALID_INPUT")
NOT_FOUND = (404, "NOT_FOUND")

SHAPES: dict[str, Shape] = {
    # Each device class, in a pool that has its atoms.
    "gpu": Shape(FITS, _gpu(2)),
    "gpu-exclusive-explicit": Shape(FITS, _gpu(2, sharing="exclusive")),
    "gpu.mig-in-mig-pool": Shape(FITS, [{"class": "gpu.mig", "count": 1}], pool="mig"),
    "gpu.mig-sharing-mig": Shape(FITS, [{"class": "gpu.mig", "count": 2, "sharing": "mig"}], pool="mig"),
    "gpu.slot-in-timeslice-pool": Shape(FITS, [{"class": "gpu.slot", "count": 2}], pool="timeslice"),
    "gpu.slot-timeslice-in-timeslice-pool": Shape(
        FITS, [{"class": "gpu.slot", "count": 2, "sharing": "timeslice"}], pool="timeslice"
    ),
    "gpu.slot-mps-in-mps-pool": Shape(
        FITS, [{"class": "gpu.slot", "count": 2, "sharing": "mps"}], pool="mps"
    ),
    "nic.vf": Shape(FITS, [{"class": "nic.vf", "count": 2}]),
    "disk": Shape(FITS, [{"class": "disk", "count": 1, "selector": {"media": "nvme"}}]),
    "node": Shape(FITS, [{"class": "node", "count": 1}]),
    "gpu-nic-disk-together": Shape(
        FITS, [*_gpu(4), {"class": "nic.vf", "count": 1}, {"class": "disk", "count": 1}]
    ),
    # Selectors and topology.
    "selector-matches": Shape(FITS, _gpu(2, selector={"vramGiB": {"gte": 80}, "gpuModel": "H100"})),
    "selector-in-list": Shape(FITS, _gpu(1, selector={"gpuModel": {"in": ["A100", "H100"]}})),
    "selector-node-label": Shape(FITS, _gpu(1, selector={"node.fabric": "ib-1"})),
    "selector-matches-nothing": Shape(NO_FIT, _gpu(1, selector={"vramGiB": {"gte": 141}})),
    "selector-unknown-attribute": Shape(INVALID, _gpu(1, selector={"colour": "green"})),
    "selector-wrong-type": Shape(INVALID, _gpu(1, selector={"vramGiB": {"gte": "80"}})),
    "item-topology-nvlink-all": Shape(FITS, _gpu(8, topology="nvlink-all")),
    "request-topology-nvlink-all": Shape(FITS, _gpu(4), fields=lambda f: {"topology": "nvlink-all"}),
    # Counts.
    "more-gpus-than-a-node-has": Shape(NO_FIT, _gpu(9)),
    "count-zero": Shape(INVALID, _gpu(0)),
    "no-devices": Shape(INVALID, []),
    # Gang and binding.
    "gang-of-2": Shape(FITS, _gpu(8), fields=lambda f: {"gang": {"size": 2}}),
    "gang-of-2-on-rack": Shape(FITS, _gpu(4), fields=lambda f: {"gang": {"size": 2, "topologyKey": "rack"}}),
    "gang-of-3-on-two-nodes": Shape(NO_FIT, _gpu(1), fields=lambda f: {"gang": {"size": 3}}),
    "binding-node": Shape(FITS, [{"class": "node", "count": 1}], fields=lambda f: {"binding": "node"}),
    "binding-node-with-gpus": Shape(FITS, _gpu(8), fields=lambda f: {"binding": "node"}),
    # Host resources.
    "resources": Shape(
        FITS, _gpu(2), fields=lambda f: {"resources": {"vcpu": 8, "memoryGiB": 64, "hugepages1Gi": 4}}
    ),
    "resources-zero-claim": Shape(FITS, _gpu(1), fields=lambda f: {"resources": {"vcpu": 0}}),
    "resources-too-many-vcpus": Shape(NO_FIT, _gpu(1), fields=lambda f: {"resources": {"vcpu": 4096}}),
    # Time, spot, lease, node profile, wait.
    "start-in-one-hour": Shape(
        FITS, _gpu(2), fields=lambda f: {"start": to_millis(compute_now()) + 3_600_000}
    ),
    "start-an-hour-ago": Shape(
        INVALID, _gpu(1), fields=lambda f: {"start": to_millis(compute_now()) - 3_600_000}
    ),
    "duration-iso": Shape(FITS, _gpu(1), fields=lambda f: {"duration": "PT8H"}),
    "spot": Shape(FITS, _gpu(2), fields=lambda f: {"spot": True}),
    "lease": Shape(FITS, _gpu(1), fields=lambda f: {"leaseSeconds": 300}),
    "node-profile": Shape(
        FITS, _gpu(1), fields=lambda f: {"node": {"profileId": "ubuntu-24.04", "profileVersion": 2}}
    ),
    "wait-zero": Shape(FITS, _gpu(1), fields=lambda f: {"wait": {"timeoutMs": 0}}),
    "unknown-field": Shape(INVALID, _gpu(1), fields=lambda f: {"colour": "green"}),
    # Projects.
    "own-project": Shape(FITS, _gpu(1), fields=lambda f: {"projectId": f.own_project.id}),
    "unknown-project": Shape(NOT_FOUND, _gpu(1), fields=lambda f: {"projectId": UNKNOWN_PROJECT}),
    "another-tenants-project": Shape(
        NOT_FOUND, _gpu(1), fields=lambda f: {"projectId": f.foreign_project.id}
    ),
    # Pools.
    "offered-pool": Shape(FITS, _gpu(2), tenant="beta"),
    "pool-the-tenant-cannot-see": Shape(NOT_FOUND, _gpu(1), pool="hidden"),
    "hidden-pool-and-unknown-project": Shape(
        NOT_FOUND, _gpu(1), pool="hidden", fields=lambda f: {"projectId": UNKNOWN_PROJECT}
    ),
    # Classes the pool's sharing mode never serves (check_request_against_pool).
    "gpu-in-mig-only-pool": Shape(INVALID, _gpu(1), pool="mig"),
    "gpu.slot-mps-in-timeslice-pool": Shape(
        INVALID, [{"class": "gpu.slot", "count": 1, "sharing": "mps"}], pool="timeslice"
    ),
    "gpu.slot-timeslice-in-mps-pool": Shape(
        INVALID, [{"class": "gpu.slot", "count": 1, "sharing": "timeslice"}], pool="mps"
    ),
    "gpu.mig-in-exclusive-pool": Shape(INVALID, [{"class": "gpu.mig", "count": 1}]),
    "gpu.slot-in-mig-pool": Shape(INVALID, [{"class": "gpu.slot", "count": 1}], pool="mig"),
    "nic.vf-in-mig-pool": Shape(NO_FIT, [{"class": "nic.vf", "count": 1}], pool="mig"),
    "gpu-sharing-mig": Shape(INVALID, _gpu(1, sharing="mig")),
    "unknown-project-in-mig-pool-with-gpu": Shape(
        NOT_FOUND, _gpu(1), pool="mig", fields=lambda f: {"projectId": UNKNOWN_PROJECT}
    ),
}


def _body(shape: Shape, fleet: Fleet) -> dict[str, Any]:
    return {
        "tenantId": shape.tenant,
        "poolId": fleet.pools[shape.pool].id,
        "devices": shape.devices,
        "duration": "1h",
        "idempotencyKey": "agreement-1",
        **shape.fields(fleet),
    }


def _error(response: Any) -> tuple[int, str, list[str]]:
    error = response.json()["error"]
    return response.status_code, error["code"], [d.get("field", "") for d in error["details"]]


def preview_verdict(response: Any) -> Any:
    if response.status_code != 200:
        return _error(response)
    answer = response.json()
    if answer["fits"]:
        return (FITS,)
    return (NO_FIT, answer["reason"]["code"])


def create_verdict(response: Any) -> Any:
    if response.status_code == 201:
        return (FITS,)
    status, code, _ = verdict = _error(response)
    if (status, code) == (409, "NO_CAPACITY"):
        return (NO_FIT, response.json()["error"]["details"][0]["code"])
    return verdict


def _kind(verdict: Any) -> str | tuple[int, str]:
    return verdict[0] if verdict[0] in (FITS, NO_FIT) else (verdict[0], verdict[1])


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(SHAPES))
def test_preview_and_create_agree(name: str, fleet: Fleet, api_client_for: ClientFor) -> None:
    shape = SHAPES[name]
    client: APIClient = api_client_for(shape.tenant, "member")
    body = _body(shape, fleet)

    preview = client.post("/api/compute/capacity/preview", body, format="json")
    created = client.post("/api/compute/reservations/create", body, format="json")

    said_preview, said_create = preview_verdict(preview), create_verdict(created)
    assert said_preview == said_create, (
        f"preview: {preview.status_code} {preview.json()}\ncreate: {created.status_code} {created.json()}"
    )
    assert _kind(said_preview) == shape.expect, preview.json()
