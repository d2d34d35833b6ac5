"""The kept per-node free-atom counts the placer ranks by, and the plans made from them.

`node_atom_counts` is kept by triggers in the statement that changes a
booking or a device; these tests change things the way the product does (the
API, the node events, the worker's phase moves with the database clock moved)
and compare the rows with the recount the torture checks use. The plan tests
show which nodes a plan starting now looks at, and that it falls back to the
whole pool when none of them fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from inventory.models import Device, Node, Pool
from operations.services import device_set_health
from reservations.lifecycle.phases import bookings_advance
from reservations.models import NodeAtomCount
from reservations.placer import plan as plan_module
from reservations.placer.plan import CANDIDATE_NODES, placement_plan, placement_window
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR, HOUR_MS, now_ms
from tests.support.factories import PoolFactory
from tests.support.placement import gpu_request, make_node
from tests.support.records import book
from tests.support.torture.checks import check_node_atom_counts


def kept(node: Node, device_class: str = "gpu") -> tuple[int, int, int]:
    """(atoms, running, free) of the node's row."""
    row = NodeAtomCount.objects.get(node_id=node.pk, device_class=device_class)
    return row.atoms, row.running, row.free


@pytest.mark.django_db
def test_a_create_takes_free_atoms_and_its_release_gives_them_back(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    assert kept(gpu_node) == (8, 0, 8)
    created = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=3))
    assert created.status_code == 201, created.json()
    assert kept(gpu_node) == (8, 3, 5)
    released = post(
        owner_client, "reservations/release", {"tenantId": "acme", "reservationId": created.json()["id"]}
    )
    assert released.status_code == 200, released.json()
    assert kept(gpu_node) == (8, 0, 8)
    assert check_node_atom_counts() == []


@pytest.mark.django_db
def test_a_future_booking_counts_only_once_it_has_started_and_until_it_ends(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, clock: Callable[[timedelta], None]
) -> None:
    body = reservation_body(owned_pool, "acme", gpus=2, start=now_ms() + HOUR_MS)
    assert post(owner_client, "reservations/create", body).status_code == 201
    assert kept(gpu_node) == (8, 0, 8)
    clock(HOUR + timedelta(minutes=1))
    assert bookings_advance() == 2
    assert kept(gpu_node) == (8, 2, 6)
    clock(2 * HOUR + timedelta(minutes=1))
    assert bookings_advance() == 2
    assert kept(gpu_node) == (8, 0, 8)
    assert check_node_atom_counts() == []


@pytest.mark.django_db
def test_an_unhealthy_atom_leaves_the_count_with_its_running_booking_and_comes_back(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    created = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=1))
    assert created.status_code == 201, created.json()
    (uid,) = created.json()["allocations"][0]["atoms"]
    device = Device.objects.get(uid=uid)
    device_set_health(device=device, healthy=False, reason="xid 79", actor="test")
    assert kept(gpu_node) == (7, 0, 7)
    assert check_node_atom_counts() == []
    device_set_health(device=Device.objects.get(uid=uid), healthy=True, reason="fixed", actor="test")
    assert kept(gpu_node) == (8, 1, 7)
    assert check_node_atom_counts() == []


@pytest.mark.django_db
def test_the_rows_follow_a_node_to_another_pool(owned_pool: Pool, gpu_node: Node) -> None:
    other = PoolFactory.create(owner=owned_pool.owner, name="moved-to")
    gpu_node.pool = other
    gpu_node.save(update_fields=["pool"])
    assert NodeAtomCount.objects.get(node_id=gpu_node.pk, device_class="gpu").pool_id == other.pk
    assert check_node_atom_counts() == []


def book_now(devices: Iterable[Device], *, hours: int) -> None:
    """Book each device from a minute ago for `hours` (RUNNING at once)."""
    for device in devices:
        book(device, timedelta(minutes=-1), timedelta(hours=hours))


def fleet(pool: Pool, *, full: int, empty: int, booked: int = 7) -> tuple[list[Node], list[Node]]:
    """`full` nodes with `booked` GPUs booked now (one free by default) and `empty` nodes, all eight free."""
    fulls = [make_node(pool, hostname=f"full-{booked}-{i:03d}") for i in range(full)]
    for node in fulls:
        book_now(Device.objects.filter(node=node).order_by("uid")[:booked], hours=2)
    empties = [make_node(pool, hostname=f"empty-{i:03d}") for i in range(empty)]
    return fulls, empties


@pytest.mark.django_db
def test_a_plan_starting_now_ranks_only_the_fullest_nodes_the_counts_name(owned_pool: Pool) -> None:
    fulls, empties = fleet(owned_pool, full=CANDIDATE_NODES + 5, empty=3)
    request = gpu_request(owned_pool, 1)
    plan = placement_plan(request=request, pool=owned_pool, window=placement_window(request=request))
    assert plan.scope == "counts"
    assert plan.fits
    chosen = {member.node_id for option in plan.options for member in option.members}
    # Bin packing: every option is a node left with one free GPU, never an empty one.
    assert chosen <= {node.pk for node in fulls}
    assert not chosen & {node.pk for node in empties}


@pytest.mark.django_db
def test_a_selector_the_candidates_miss_is_found_in_the_whole_pool(
    owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three candidates per plan: whichever node of the one-free group the plan starts
    # at, the three come from that group and the two-free one, never the empty node.
    monkeypatch.setattr(plan_module, "CANDIDATE_NODES", 3)
    fleet(owned_pool, full=6, empty=0)
    fleet(owned_pool, full=3, empty=0, booked=6)
    small = make_node(owned_pool, hostname="small-vram", vram=40)
    request = gpu_request(owned_pool, 1, selector={"vramGiB": {"lte": 40}})
    plan = placement_plan(request=request, pool=owned_pool, window=placement_window(request=request))
    assert plan.scope == "pool"
    assert [option.members[0].node_id for option in plan.options] == [small.pk]


@pytest.mark.django_db
def test_a_plan_for_later_ranks_the_whole_pool(owned_pool: Pool) -> None:
    fleet(owned_pool, full=3, empty=1)
    request = gpu_request(owned_pool, 1, start_ms=now_ms() + 3 * HOUR_MS)
    plan = placement_plan(request=request, pool=owned_pool, window=placement_window(request=request))
    assert plan.scope == "pool"
    # Three hours from now the "full" nodes' bookings have ended: every node is empty again.
    assert plan.fits


@pytest.mark.django_db
def test_a_node_whose_counts_lag_the_clock_is_still_found(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    (node,), _ = fleet(owned_pool, full=1, empty=0)
    # Every GPU of the only node is booked until an hour from now, seven of them for two hours.
    book_now(Device.objects.filter(node=node).order_by("uid")[7:], hours=1)
    # An hour and a minute later, the last GPU's booking has ended but its phase has not moved
    # (the worker is behind): the counts still say the node is full.
    clock(HOUR + timedelta(minutes=1))
    assert kept(node) == (8, 8, 0)
    request = gpu_request(owned_pool, 1)
    plan = placement_plan(request=request, pool=owned_pool, window=placement_window(request=request))
    assert plan.scope == "pool"
    assert [option.members[0].node_id for option in plan.options] == [node.pk]
