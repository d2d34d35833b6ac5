"""The kept per-pool fabric counts that `capacity/byPool`'s fragmentation sums.

`pool_fabric_counts` is kept by triggers from `node_atom_counts`, whose rows
carry their node's schedulability and `fabric` label. Each test changes one
input of those counts (a booking over the API, a node action, a health
change, the worker's phase move, a label, a pool move, a pool's new owner, a
node or device going away), through the product's service where there is
one and by updating the row where there is not, and compares the kept rows
with the recount the torture checks use, which reads nodes, devices and
bookings and none of the kept rows; and the answer a tenant reads over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from capacity.selectors.pools import pool_fragmentation
from inventory.models import Device, Node, Pool
from operations.services import (
    device_set_health,
    node_cordon,
    node_set_maintenance,
    node_taint,
    node_uncordon,
    node_untaint,
)
from reservations.lifecycle.phases import bookings_advance
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR, HOUR_MS, now_ms
from tests.support.factories import DeviceFactory, PoolFactory, TenantFactory
from tests.support.placement import make_node
from tests.support.torture.checks import check_pool_fabric_counts


def groups(client: APIClient, pool: Pool) -> dict[str, tuple[int, int, int, int]]:
    """byPool's fragmentation over HTTP: per fabric, (nodes, free, whole-node gang, stranded)."""
    answer = post(client, "capacity/byPool", {"tenantId": "acme", "poolId": pool.id})
    assert answer.status_code == 200, answer.json()
    assert check_pool_fabric_counts() == []
    return {
        group["value"]: (group["nodes"], group["nodesFree"], group["wholeNodeGang"], group["strandedAtoms"])
        for group in answer.json()["fragmentation"]["groups"]
    }


@pytest.fixture
def two_fabrics(owned_pool: Pool) -> dict[str, Node]:
    """Two free 8-GPU nodes on fabric f-a and one on f-b."""
    return {
        "a1": make_node(owned_pool, hostname="a1", labels={"fabric": "f-a"}),
        "a2": make_node(owned_pool, hostname="a2", labels={"fabric": "f-a"}),
        "b1": make_node(owned_pool, hostname="b1", labels={"fabric": "f-b"}),
    }


@pytest.mark.django_db
def test_creates_and_releases_move_free_nodes_and_stranded_atoms(
    owner_client: APIClient, owned_pool: Pool, two_fabrics: dict[str, Node]
) -> None:
    assert groups(owner_client, owned_pool) == {"f-a": (2, 2, 2, 0), "f-b": (1, 1, 1, 0)}
    created = [
        post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=3, key=f"k{i}"))
        for i in range(2)
    ]
    assert all(answer.status_code == 201 for answer in created), [answer.json() for answer in created]
    after = groups(owner_client, owned_pool)
    # Six GPUs on one node (bin packing) or three on each of two: either way six are booked.
    assert sum(nodes for nodes, *_ in after.values()) == 3
    assert sum(stranded + 8 * free for _, free, _, stranded in after.values()) == 24 - 6
    for answer in created:
        body = {"tenantId": "acme", "reservationId": answer.json()["id"]}
        assert post(owner_client, "reservations/release", body).status_code == 200
    assert groups(owner_client, owned_pool) == {"f-a": (2, 2, 2, 0), "f-b": (1, 1, 1, 0)}


@pytest.mark.django_db
def test_a_future_booking_counts_once_the_worker_moves_it_to_running(
    owner_client: APIClient, owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, hostname="only", labels={"fabric": "f-a"})
    body = reservation_body(owned_pool, "acme", gpus=2, start=now_ms() + HOUR_MS)
    assert post(owner_client, "reservations/create", body).status_code == 201
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 1, 0)}
    clock(HOUR + timedelta(minutes=1))
    assert bookings_advance() == 2
    assert groups(owner_client, owned_pool) == {"f-a": (1, 0, 0, 6)}
    clock(2 * HOUR + timedelta(minutes=1))
    assert bookings_advance() == 2
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 1, 0)}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("leave", "come_back"),
    [
        (
            lambda node: node_cordon(node=node, reason="fan", actor="t"),
            lambda node: node_uncordon(node=node, actor="t"),
        ),
        (
            lambda node: node_set_maintenance(node=node, on=True, reason="psu", actor="t"),
            lambda node: node_set_maintenance(node=node, on=False, reason="", actor="t"),
        ),
        (
            lambda node: node_taint(
                node=node, key="gpu.xid", value="79", effect="NoSchedule", reason="xid", actor="t"
            ),
            lambda node: node_untaint(node=node, key="gpu.xid", actor="t"),
        ),
        (
            lambda node: Node.objects.filter(pk=node.pk).update(connectivity="disconnected"),
            lambda node: Node.objects.filter(pk=node.pk).update(connectivity="connected"),
        ),
    ],
    ids=["cordon", "maintenance", "taint", "connectivity"],
)
def test_a_node_leaving_the_schedulable_set_leaves_its_fabric_and_comes_back(
    owner_client: APIClient,
    owned_pool: Pool,
    two_fabrics: dict[str, Node],
    leave: Callable[[Node], Any],
    come_back: Callable[[Node], Any],
) -> None:
    leave(two_fabrics["a1"])
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 1, 0), "f-b": (1, 1, 1, 0)}
    come_back(Node.objects.get(pk=two_fabrics["a1"].pk))
    assert groups(owner_client, owned_pool) == {"f-a": (2, 2, 2, 0), "f-b": (1, 1, 1, 0)}


@pytest.mark.django_db
def test_an_unhealthy_gpu_breaks_a_whole_node_and_strands_nothing(
    owner_client: APIClient, owned_pool: Pool, two_fabrics: dict[str, Node]
) -> None:
    device = Device.objects.filter(node=two_fabrics["b1"]).order_by("uid").first()
    assert device is not None
    device_set_health(device=device, healthy=False, reason="xid 79", actor="t")
    # Seven healthy GPUs, none booked: a free node, but not a whole 8-GPU one.
    assert groups(owner_client, owned_pool) == {"f-a": (2, 2, 2, 0), "f-b": (1, 1, 0, 0)}
    device_set_health(device=Device.objects.get(pk=device.pk), healthy=True, reason="fixed", actor="t")
    assert groups(owner_client, owned_pool) == {"f-a": (2, 2, 2, 0), "f-b": (1, 1, 1, 0)}


@pytest.mark.django_db
def test_a_relabelled_node_moves_fabric_with_its_bookings(
    owner_client: APIClient, owned_pool: Pool, two_fabrics: dict[str, Node]
) -> None:
    body = reservation_body(owned_pool, "acme", gpus=8, key="whole")
    assert post(owner_client, "reservations/create", body).status_code == 201
    node = two_fabrics["b1"]
    node.labels = {"fabric": "f-c", "rack": "r2"}
    node.save()
    moved = groups(owner_client, owned_pool)
    assert moved["f-c"][0] == 1 and "f-b" not in moved
    node.labels = {"rack": "r2"}
    node.save()
    assert groups(owner_client, owned_pool)[""][0] == 1


@pytest.mark.django_db
def test_a_node_moved_to_another_pool_takes_its_counts_along(
    owner_client: APIClient, owned_pool: Pool, two_fabrics: dict[str, Node]
) -> None:
    other = PoolFactory.create(owner=owned_pool.owner, name="moved-to")
    node = two_fabrics["a2"]
    node.pool = other
    node.save(update_fields=["pool"])
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 1, 0), "f-b": (1, 1, 1, 0)}
    assert pool_fragmentation(pool_id=other.pk, sharing="exclusive")["groups"] == [
        {"value": "f-a", "nodes": 1, "nodesFree": 1, "wholeNodeGang": 1, "strandedAtoms": 0}
    ]


@pytest.mark.django_db
def test_a_pool_given_to_another_owner_loses_the_old_owners_nodes(owned_pool: Pool) -> None:
    owner = owned_pool.owner
    make_node(owned_pool, hostname="platform", labels={"fabric": "f-a"})
    make_node(owned_pool, hostname="owned", labels={"fabric": "f-a"}, trust="tenant-owned", owner=owner)

    def counts() -> list[tuple[str, int]]:
        assert check_pool_fabric_counts() == []
        fragmentation = pool_fragmentation(pool_id=owned_pool.pk, sharing="exclusive")
        return [(group["value"], group["nodes"]) for group in fragmentation["groups"]]

    assert counts() == [("f-a", 2)]
    owned_pool.owner = TenantFactory.create(id="newco")
    owned_pool.save(update_fields=["owner"])
    assert counts() == [("f-a", 1)]
    owned_pool.owner = owner
    owned_pool.save(update_fields=["owner"])
    assert counts() == [("f-a", 2)]


@pytest.mark.django_db
def test_atoms_added_and_taken_away(owner_client: APIClient, owned_pool: Pool) -> None:
    small = make_node(owned_pool, hostname="small", labels={"fabric": "f-a"}, gpus=7)
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 0, 0)}
    DeviceFactory.create(node=small, uid="GPU-small-7", attributes={"gpuModel": "H100", "vramGiB": 80})
    assert groups(owner_client, owned_pool) == {"f-a": (1, 1, 1, 0)}
    Device.objects.filter(node=small).update(bookable=False)
    assert groups(owner_client, owned_pool) == {}
    Device.objects.filter(node=small).delete()
    small.delete()
    assert groups(owner_client, owned_pool) == {}


@pytest.mark.django_db
def test_a_time_sliced_pool_counts_every_free_node_as_whole(owned_pool: Pool) -> None:
    sliced = PoolFactory.create(owner=owned_pool.owner, name="l40s-ts", sharing="timeslice")
    node = make_node(sliced, hostname="ts-1", labels={"fabric": "f-t"}, gpus=0)
    for index in range(4):
        DeviceFactory.create(node=node, uid=f"slot-{index}", device_class="gpu.slot", attributes={})
    fragmentation = pool_fragmentation(pool_id=sliced.pk, sharing="timeslice")
    assert fragmentation["deviceClass"] == "gpu.slot"
    assert fragmentation["groups"] == [
        {"value": "f-t", "nodes": 1, "nodesFree": 1, "wholeNodeGang": 1, "strandedAtoms": 0}
    ]
    assert check_pool_fabric_counts() == []
