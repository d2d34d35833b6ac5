"""Node events on real connections: the wake-ups they send, and a cordon racing an advance or a release.

A change that takes booked atoms out of the counts asks the worker for repair; capacity coming
back wakes the pool's waiting creates. A cordon held open makes an advance or a release wait
on the node's lock, and each then counts only what the cordon left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.clock import set_clock_offset
from core.constants import WORKER_CHANNEL
from inventory.models import Node, Pool
from operations.services import node_cordon
from reservations.models import Reservation
from reservations.rollups.recount import rollup_rebuild, rollup_recount
from reservations.waits import LISTENER, RELEASE_CHANNEL
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR_MS, now_ms, with_clock_offset
from tests.support.factories import NodeFactory
from tests.support.node_events import api, report
from tests.support.notifications import listening
from tests.support.placement import make_node
from tests.support.records import snapshot, snapshot_after_rebuild
from tests.support.threads import JOIN_SECONDS, Worker, started_until_blocked, transaction_held_open

# --- Wake-ups ------------------------------------------------------------------------------


@pytest.fixture
def cordoned_node(owned_pool: Pool) -> Node:
    """A node of two GPUs in `owned_pool`, cordoned: out of every count until an uncordon."""
    return make_node(owned_pool, gpus=2, cordoned=True)


@pytest.mark.django_db(transaction=True)
def test_booked_atoms_leaving_the_counted_set_ask_the_worker_for_repair(
    operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    with listening(WORKER_CHANNEL) as worker:
        api("nodes/cordon", reason="PSU swap")(operator_client, booked)
        assert worker.next() == "repair"
    with listening(WORKER_CHANNEL) as worker:
        # Capacity back: a reservation marked at risk there may fit now, so repair at once.
        api("nodes/uncordon")(operator_client, booked)
        assert worker.next() == "repair"


@pytest.mark.django_db(transaction=True)
def test_capacity_coming_back_wakes_the_waiters_of_the_pool(
    operator_client: APIClient, node_agent_client: APIClient, owned_pool: Pool, cordoned_node: Node
) -> None:
    with listening(RELEASE_CHANNEL) as waiters:
        api("nodes/uncordon")(operator_client, cordoned_node)
        assert waiters.next() == owned_pool.id
        api("nodes/taint", key="k", effect="NoSchedule", reason="xid")(operator_client, cordoned_node)
        api("nodes/untaint", key="k")(operator_client, cordoned_node)
        assert waiters.next() == owned_pool.id
        fresh = NodeFactory.create(pool=owned_pool, hostname="gpu-w-001")
        report(node_agent_client, fresh, gpus=1)
        assert waiters.next() == owned_pool.id
        api("nodes/cordon", reason="again")(operator_client, cordoned_node)  # capacity fell: nobody to wake
        assert waiters.none()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_create_is_woken_by_an_uncordon_and_succeeds(
    owner_client: APIClient, operator_client: APIClient, owned_pool: Pool, cordoned_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.id)
    body = reservation_body(owned_pool, "acme", "patient", gpus=2, wait={"timeoutMs": 30000})
    create = Worker(lambda: post(owner_client, "reservations/create", body))
    create.start()
    deadline = time.monotonic() + JOIN_SECONDS
    while LISTENER.waiting() == 0 and create.is_alive():
        assert time.monotonic() < deadline, "the create never waited"
        time.sleep(0.01)
    assert create.is_alive(), f"the create did not wait: {create.result or create.error!r}"

    with listening(RELEASE_CHANNEL) as waiters:
        api("nodes/uncordon")(operator_client, cordoned_node)
        assert waiters.next() == owned_pool.id  # the wake-up the waiting create hears

    answer = create.finish()
    assert create.error is None
    assert answer.status_code == 201, answer.json()
    assert answer.json().get("error", {}).get("code") != "NO_CAPACITY"
    assert len(answer.json()["allocations"][0]["atoms"]) == 2


# --- A cordon against an advance and a release, on real connections ---------------------------


def behind_a_cordon_held_open(node: Node, action: Callable[[], Any]) -> Worker:
    """`action` on its own connection (clock 90 minutes on), started while a cordon of `node` is held open.

    Once `action` waits for the node's lock the cordon holds, the cordon commits; the action's
    worker is returned when both have ended without raising.
    """
    later = timedelta(minutes=90)
    cordon, commit = transaction_held_open(
        with_clock_offset(later, lambda: node_cordon(node=node, reason="PSU swap", actor="ops"))
    )
    acting = started_until_blocked(with_clock_offset(later, action))  # on the node the cordon holds
    commit.set()
    cordon.join_ok()
    acting.join_ok()
    return acting


@pytest.fixture
def two_nodes_booked_later(owner_client: APIClient, owned_pool: Pool) -> Iterator[tuple[Node, str]]:
    """Two nodes of 2 GPUs, each with a reservation of both from an hour on; every clock 90 minutes on."""
    make_node(owned_pool, gpus=2)
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    ids = []
    for key in ("a", "b"):
        body = reservation_body(owned_pool, "acme", key, gpus=2, start=now_ms() + HOUR_MS)
        created = post(owner_client, "reservations/create", body)
        assert created.status_code == 201, created.json()
        ids.append(created.json()["id"])
    first = Reservation.objects.get(pk=ids[0]).allocations.get().node
    set_clock_offset(timedelta(minutes=90))
    yield first, ids[0]
    set_clock_offset(timedelta(0))


@pytest.mark.django_db(transaction=True)
def test_an_advance_waits_for_a_cordon_of_the_node_and_counts_what_the_cordon_left(
    owned_pool: Pool, two_nodes_booked_later: tuple[Node, str]
) -> None:
    from reservations.lifecycle.phases import bookings_advance

    node, _ = two_nodes_booked_later
    advance = behind_a_cordon_held_open(node, bookings_advance)

    assert advance.result == 4
    # The cordoned node's bookings left the counts with the cordon; only the other node's moved.
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 2, 0)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db(transaction=True)
def test_a_release_waits_for_a_cordon_of_its_node_and_gives_back_only_what_is_counted(
    owned_pool: Pool, two_nodes_booked_later: tuple[Node, str]
) -> None:
    from reservations.services import reservation_release

    node, reservation_id = two_nodes_booked_later
    behind_a_cordon_held_open(
        node,
        lambda: reservation_release(reservation=Reservation.objects.get(pk=reservation_id), actor="tenant"),
    )

    # Nothing runs yet (no advance): the other node's two bookings are still reserved.
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 0, 2)
    recount = rollup_recount(pool_ids=[owned_pool.id])
    assert all(getattr(row, name) == n for name, n in recount[(owned_pool.id, "gpu")].items())
    # A rebuild first starts the other node's bookings (with their delta), and agrees.
    before = snapshot([owned_pool.id])
    assert snapshot_after_rebuild(owned_pool) != before
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 2, 0)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
