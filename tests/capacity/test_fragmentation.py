"""`capacity/byPool`'s fragmentation, over HTTP, against a brute-force count from devices and bookings.

The answer comes from the counts the placer keeps (`node_atom_counts`); the
brute force here reads every node, device and booking of the pool and
applies the definition as the description states it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core.clock import compute_now
from inventory.models import Device, Node, Pool
from inventory.schedulability import predicate_terms
from operations.services import device_set_health, node_cordon
from reservations.models import DeviceBooking
from tests.support.admin import links_of
from tests.support.api import post
from tests.support.factories import PoolFactory
from tests.support.placement import make_node
from tests.support.records import book


def brute_force(pool: Pool) -> list[dict[str, Any]]:
    """Per fabric: schedulable nodes with healthy GPUs, free ones, whole 8-GPU free ones, stranded GPUs."""
    now = compute_now()
    groups: dict[str, dict[str, int]] = defaultdict(
        lambda: {"nodes": 0, "nodesFree": 0, "wholeNodeGang": 0, "strandedAtoms": 0}
    )
    for node in Node.objects.filter(pool=pool).order_by("id"):
        if not all(term.ok for term in predicate_terms(node)):
            continue
        gpus = list(Device.objects.filter(node=node, device_class="gpu", healthy=True, bookable=True))
        if not gpus:
            continue
        busy = {
            booking.device_id
            for booking in DeviceBooking.objects.filter(device__in=gpus)
            if booking.during.lower <= now and (booking.during.upper is None or now < booking.during.upper)
        }
        group = groups[node.labels.get("fabric", "")]
        group["nodes"] += 1
        if not busy:
            group["nodesFree"] += 1
            group["wholeNodeGang"] += len(gpus) >= 8
        else:
            group["strandedAtoms"] += len(gpus) - len(busy)
    return [{"value": value, **counts} for value, counts in sorted(groups.items())]


@pytest.mark.django_db
def test_fragmentation_matches_a_brute_force_count(owner_client: APIClient, owned_pool: Pool) -> None:
    fabric_a, fabric_b = {"fabric": "f-a"}, {"fabric": "f-b"}
    make_node(owned_pool, hostname="a-free", labels=fabric_a)
    partly = make_node(owned_pool, hostname="a-partly", labels=fabric_a)
    later = make_node(owned_pool, hostname="a-later", labels=fabric_a)
    cordoned = make_node(owned_pool, hostname="b-cordoned", labels=fabric_b)
    make_node(owned_pool, hostname="b-small", labels=fabric_b, gpus=4)
    sick = make_node(owned_pool, hostname="b-sick", labels=fabric_b)
    full = make_node(owned_pool, hostname="unlabelled-full", labels={"rack": "r9"})
    # A node of another pool on the same fabric is not this pool's.
    make_node(PoolFactory.create(owner=owned_pool.owner, name="elsewhere"), hostname="x", labels=fabric_a)
    for device in Device.objects.filter(node=partly).order_by("uid")[:2]:
        book(device, timedelta(minutes=-5), timedelta(hours=1))
    for device in Device.objects.filter(node=later).order_by("uid")[:3]:
        book(device, timedelta(hours=2), timedelta(hours=3))
    for device in Device.objects.filter(node=full):
        book(device, timedelta(minutes=-5), timedelta(hours=1))
    node_cordon(node=cordoned, reason="fan", actor="test")
    device_set_health(device=Device.objects.filter(node=sick).first(), healthy=False, reason="xid", actor="t")

    answer = post(owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.id})
    assert answer.status_code == 200, answer.json()
    fragmentation = answer.json()["fragmentation"]
    assert fragmentation["topologyKey"] == "fabric" and fragmentation["deviceClass"] == "gpu"
    assert fragmentation["groups"] == brute_force(owned_pool)
    # And what that is, spelled out: f-a has three free-now nodes of which all are whole
    # (the later booking does not count now) and six GPUs stranded beside two booked ones.
    assert fragmentation["groups"] == [
        {"value": "", "nodes": 1, "nodesFree": 0, "wholeNodeGang": 0, "strandedAtoms": 0},
        {"value": "f-a", "nodes": 3, "nodesFree": 2, "wholeNodeGang": 2, "strandedAtoms": 6},
        {"value": "f-b", "nodes": 2, "nodesFree": 2, "wholeNodeGang": 0, "strandedAtoms": 0},
    ]


@pytest.mark.django_db
def test_fragmentation_moves_with_a_create_and_a_release(owner_client: APIClient, owned_pool: Pool) -> None:
    make_node(owned_pool, hostname="only", labels={"fabric": "f-a"})

    def groups() -> list[dict[str, Any]]:
        body = {"tenantId": "acme", "poolId": owned_pool.id}
        return post(owner_client, "capacity/byPool", body).json()["fragmentation"]["groups"]

    assert groups() == [{"value": "f-a", "nodes": 1, "nodesFree": 1, "wholeNodeGang": 1, "strandedAtoms": 0}]
    body = {
        "tenantId": "acme",
        "poolId": owned_pool.id,
        "devices": [{"class": "gpu", "count": 3}],
        "duration": "1h",
        "idempotencyKey": "frag-1",
    }
    created = post(owner_client, "reservations/create", body)
    assert created.status_code == 201, created.json()
    assert groups() == [{"value": "f-a", "nodes": 1, "nodesFree": 0, "wholeNodeGang": 0, "strandedAtoms": 5}]
    released = post(
        owner_client, "reservations/release", {"tenantId": "acme", "reservationId": created.json()["id"]}
    )
    assert released.status_code == 200, released.json()
    assert groups() == [{"value": "f-a", "nodes": 1, "nodesFree": 1, "wholeNodeGang": 1, "strandedAtoms": 0}]


@pytest.mark.django_db
def test_the_pool_page_shows_the_fragmentation_reached_from_the_pool_list(
    operator: Client, owned_pool: Pool
) -> None:
    make_node(owned_pool, hostname="a-free", labels={"fabric": "f-a"})
    partly = make_node(owned_pool, hostname="a-partly", labels={"fabric": "f-a"})
    for device in Device.objects.filter(node=partly).order_by("uid")[:3]:
        book(device, timedelta(minutes=-5), timedelta(hours=1))
    listing = operator.get(reverse("admin:inventory_pool_changelist")).content.decode()
    (link,) = [href for href in links_of(listing) if href.endswith("/change/")]
    page = operator.get(link)
    assert page.status_code == 200
    table = page.content.decode().split('id="fragmentation-rows"', 1)[1].split("</table>", 1)[0]
    cells = [[cell.strip() for cell in row.split("<td>")[1:]] for row in table.split("<tr>") if "<td>" in row]
    assert [[cell.split("</td>")[0] for cell in row] for row in cells] == [["f-a", "2", "1", "1", "5"]]
