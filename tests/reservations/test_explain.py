"""`capacity/explain` over HTTP: every node of the pool in the first filter that removes it, with reasons.

The counts add up to the pool's node count; samples name atoms, counts and
times, never another tenant's reservation; a tenant who cannot see the pool
gets NOT_FOUND, and bad input the contract's envelope.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from inventory.models import Device, Node, Pool
from operations.services import node_cordon, node_taint
from reservations.models import Reservation
from tests.support.api import post
from tests.support.factories import AllocationFactory, NodeResourceFactory, ReservationFactory, TenantFactory
from tests.support.placement import make_node
from tests.support.records import book

EXPLAIN = "capacity/explain"


def body(pool: Pool, **extra: Any) -> dict[str, Any]:
    return {
        "tenantId": "acme",
        "poolId": pool.id,
        "devices": [{"class": "gpu", "count": 4, "selector": {"vramGiB": {"gte": 80}}}],
        "duration": "1h",
        "idempotencyKey": "why-1",
        "resources": {"vcpu": 8},
        **extra,
    }


def fleet(pool: Pool) -> dict[str, Node]:
    """One node per filter, and two that fit."""
    nodes = {
        name: make_node(pool, hostname=name, resources={"vcpu": 64})
        for name in ("fits-1", "fits-2", "cordoned", "tainted", "full", "no-vcpu")
    }
    nodes["small-vram"] = make_node(pool, hostname="small-vram", vram=40, resources={"vcpu": 64})
    node_cordon(node=nodes["cordoned"], reason="RMA 1234", actor="t")
    node_taint(node=nodes["tainted"], key="gpu/xid", value="79", effect="NoSchedule", reason="xid", actor="t")
    # Another tenant books five of the eight GPUs of "full" for two hours: three stay free.
    other = ReservationFactory(pool=pool, tenant=TenantFactory(id="other-co"), state="active")
    allocation = AllocationFactory(node=nodes["full"], reservation=other)
    for device in Device.objects.filter(node=nodes["full"]).order_by("uid")[:5]:
        book(device, timedelta(minutes=-10), timedelta(hours=2), allocation=allocation)
    resource = nodes["no-vcpu"].resources.get(resource="vcpu")
    resource.allocated = 60
    resource.save(update_fields=["allocated"])
    return nodes


@pytest.mark.django_db
def test_every_node_is_counted_once_under_the_first_filter_that_removes_it(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    nodes = fleet(owned_pool)
    answer = post(owner_client, EXPLAIN, body(owned_pool))
    assert answer.status_code == 200, answer.json()
    explained = answer.json()
    removed = explained["removed"]
    assert removed == {
        "notSchedulable": {"maintenance": 1, "unhealthy": 1},
        "scalars": 1,
        "selector": 1,
        "noFreeAtoms": 1,
        "topology": 0,
    }
    assert explained["fit"] == 2
    total = sum(removed["notSchedulable"].values()) + sum(
        count for name, count in removed.items() if name != "notSchedulable"
    )
    assert total + explained["fit"] == explained["nodes"] == Node.objects.filter(pool=owned_pool).count()
    reasons = {s["nodeId"]: s["reason"] for samples in explained["samples"].values() for s in samples}
    assert reasons[nodes["cordoned"].id] == "maintenance; cordoned: RMA 1234"
    assert reasons[nodes["tainted"].id] == "unhealthy; 1 NoSchedule taint(s)"
    assert reasons[nodes["no-vcpu"].id] == "vcpu 60 of 64 claimed, 8 asked"
    assert reasons[nodes["small-vram"].id] == "0 gpu atoms match the selector, 4 gpu asked"
    full = reasons[nodes["full"].id]
    assert full.startswith("3 of 8 free for the window, 4 gpu asked; GPU-full-") and " booked until " in full
    # Nothing names the other tenant or its reservation.
    text = answer.content.decode()
    other = Reservation.objects.get(tenant_id="other-co")
    assert "other-co" not in text and other.id not in text
    # The preview rides along and agrees: two nodes fit.
    assert explained["preview"]["fits"] and {c["nodeId"] for c in explained["preview"]["candidates"]} == {
        nodes["fits-1"].id,
        nodes["fits-2"].id,
    }


@pytest.mark.django_db
def test_one_node_is_explained_alone(owner_client: APIClient, owned_pool: Pool) -> None:
    nodes = fleet(owned_pool)
    answer = post(owner_client, EXPLAIN, body(owned_pool, nodeId=nodes["full"].id))
    assert answer.status_code == 200, answer.json()
    explained = answer.json()
    assert explained["nodes"] == 1 and explained["removed"]["noFreeAtoms"] == 1 and explained["fit"] == 0
    assert [s["nodeId"] for s in explained["samples"]["noFreeAtoms"]] == [nodes["full"].id]


@pytest.mark.django_db
def test_explain_refuses_what_preview_refuses_and_a_node_of_another_pool(
    owner_client: APIClient, outsider_client: APIClient, owned_pool: Pool, archived_pool: Pool
) -> None:
    make_node(owned_pool, hostname="here")
    elsewhere = make_node(archived_pool, hostname="elsewhere")
    # A tenant who cannot see the pool learns nothing about it.
    hidden = post(outsider_client, EXPLAIN, {**body(owned_pool), "tenantId": "outsider"})
    assert hidden.status_code in (403, 404) and "error" in hidden.json()
    # A node of another pool is not found; a malformed one is bad input; both change nothing.
    missing = post(owner_client, EXPLAIN, body(owned_pool, nodeId=elsewhere.id))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    bad = post(owner_client, EXPLAIN, body(owned_pool, nodeId="not-a-node"))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_INPUT"
    assert bad.json()["error"]["details"][0]["field"] == "nodeId"
    unknown = post(owner_client, EXPLAIN, body(owned_pool, explainMore=True))
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "INVALID_INPUT"


@pytest.mark.django_db
def test_a_scalar_request_on_a_node_without_that_resource_says_so(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    bare = make_node(owned_pool, hostname="bare")
    NodeResourceFactory(node=make_node(owned_pool, hostname="roomy"), resource="vcpu", allocatable=64)
    answer = post(owner_client, EXPLAIN, body(owned_pool))
    assert answer.status_code == 200, answer.json()
    reasons = {s["nodeId"]: s["reason"] for s in answer.json()["samples"]["scalars"]}
    assert reasons == {bare.id: "no vcpu on the node"}
