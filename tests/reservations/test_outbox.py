"""The delivery outbox: the whole assignment reaches the node after commit, and nothing is lost on the way.

A create writes an "assign" row and a release a "shorten" row in their own
transaction; the request delivers them after commit, and what it could not
deliver (a node unreachable, a process that died) the worker delivers from
the outbox (`outbox_deliver_due`), in order, once, with a backoff.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from core.clock import compute_now, set_clock_offset
from core.constants import WORKER_CHANNEL
from inventory.models import Node, Pool
from reservations.delivery import outbox, sending
from reservations.delivery.daemon import daemon_claims, daemon_holdings
from reservations.delivery.outbox import MAX_RETRY_SECONDS, outbox_deliver_due, outbox_next_attempt
from reservations.models import Delivery, Reservation
from reservations.services import reservation_create, reservation_release
from tests.support.api import post, reservation_body
from tests.support.commands import child_env_on_this_database, run_python
from tests.support.notifications import listening
from tests.support.placement import gpu_request, make_node
from tests.support.threads import JOIN_SECONDS, Worker

pytestmark = pytest.mark.django_db(transaction=True)

PROFILE = {"profileId": "k8s/worker:1.31", "profileVersion": 3}


@pytest.fixture
def node(owned_pool: Pool) -> Node:
    return make_node(owned_pool, gpus=4, resources={"vcpu": 16, "memoryGiB": 256})


class Unreachable(ConnectionError):
    """What a node that cannot be reached looks like to the control plane."""


def unreachable(**_: Any) -> Any:
    raise Unreachable("node did not answer")


def uids(node: Node) -> list[str]:
    return sorted(node.devices.values_list("uid", flat=True))


def holders(node: Node) -> dict[str, list[tuple[str, datetime, datetime]]]:
    return {uid: daemon_holdings(device_uid=uid) for uid in uids(node) if daemon_holdings(device_uid=uid)}


@pytest.fixture(autouse=True)
def fresh_node_records() -> None:
    """The fake daemon's tables have no model, so a flush between tests leaves them: start empty."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fake_daemon_assignments, fake_daemon_claims")


def create(client: APIClient, pool: Pool, key: str, **extra: Any) -> dict[str, Any]:
    created = post(client, "reservations/create", reservation_body(pool, "acme", key, **extra))
    assert created.status_code == 201, created.json()
    answer: dict[str, Any] = created.json()
    return answer


# --- The whole assignment ----------------------------------------------------------------------


def test_a_create_delivers_its_atoms_scalar_claims_and_node_profile_and_leaves_no_row(
    owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    answer = create(
        owner_client, owned_pool, "whole", gpus=2, resources={"vcpu": 8, "memoryGiB": 64}, node=PROFILE
    )
    reservation = Reservation.objects.get(pk=answer["id"])
    atoms = answer["allocations"][0]["atoms"]
    assert {uid: [h[0] for h in held] for uid, held in holders(node).items()} == {
        uid: [reservation.id] for uid in atoms
    }
    [claims] = daemon_claims(reservation_id=reservation.id)
    assert claims.node_id == node.id and claims.allocation_id == answer["allocations"][0]["id"]
    assert claims.resources == {"vcpu": 8, "memoryGiB": 64}
    assert claims.node_profile == PROFILE
    assert (claims.starts_at, claims.ends_at) == (reservation.starts_at, reservation.ends_at)
    assert not Delivery.objects.exists()


def test_a_create_without_a_profile_or_scalars_is_recorded_with_none(
    owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    answer = create(owner_client, owned_pool, "bare", gpus=1)
    [claims] = daemon_claims(reservation_id=answer["id"])
    assert claims.resources == {} and claims.node_profile is None


def test_a_release_cuts_or_drops_the_nodes_record_of_atoms_and_claims(
    owner_client: APIClient, owned_pool: Pool, node: Node
) -> None:
    running = create(owner_client, owned_pool, "running", gpus=1, resources={"vcpu": 4})
    later = int((compute_now() + timedelta(hours=2)).timestamp() * 1000)
    future = create(owner_client, owned_pool, "future", gpus=1, resources={"vcpu": 4}, start=later)
    for answer in (running, future):
        released = post(
            owner_client, "reservations/release", {"tenantId": "acme", "reservationId": answer["id"]}
        )
        assert released.status_code == 200
    stopped = Reservation.objects.get(pk=running["id"])
    assert stopped.released_at is not None
    [claims] = daemon_claims(reservation_id=running["id"])
    assert claims.ends_at == stopped.released_at
    [atom] = running["allocations"][0]["atoms"]
    assert [end for holder, _, end in daemon_holdings(device_uid=atom) if holder == running["id"]] == [
        stopped.released_at
    ]
    # The future one never ran: the node keeps nothing of it.
    assert daemon_claims(reservation_id=future["id"]) == []
    [atom] = future["allocations"][0]["atoms"]
    assert [h for h in daemon_holdings(device_uid=atom) if h[0] == future["id"]] == []
    assert not Delivery.objects.exists()


def test_a_redelivery_adds_nothing(owned_pool: Pool, node: Node) -> None:
    reservation, _ = reservation_create(request=gpu_request(owned_pool, 2, resources={"vcpu": 4}), actor="t")
    before = (holders(node), daemon_claims(reservation_id=reservation.pk))
    sending.delivery_send(reservation_id=reservation.pk, kind="assign")
    sending.delivery_send(reservation_id=reservation.pk, kind="assign")
    assert (holders(node), daemon_claims(reservation_id=reservation.pk)) == before


# --- Retries -----------------------------------------------------------------------------------


def test_an_unreachable_node_leaves_the_row_backed_off_and_the_worker_delivers_it_later(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:
    monkeypatch.setattr(sending, "daemon_deliver", unreachable)
    with listening(WORKER_CHANNEL) as worker:
        reservation, created = reservation_create(request=gpu_request(owned_pool, 2), actor="t")
        assert created  # the booking stands: the node is told later
        worker.next()  # the create's own wake-up
        # The failed delivery wakes the worker with its next attempt.
        failed_at = datetime.fromisoformat(worker.next())
    row = Delivery.objects.get()
    assert (row.reservation_id, row.kind, row.attempts) == (reservation.pk, "assign", 1)
    assert "Unreachable: node did not answer" in row.last_error
    assert row.next_attempt_at == failed_at == outbox_next_attempt()
    assert holders(node) == {}

    # Not due yet: the worker leaves it.
    assert outbox_deliver_due() == 0
    # Due, still unreachable: one more attempt, and the wait doubles.
    clock(timedelta(seconds=3))
    assert outbox_deliver_due() == 0
    again = Delivery.objects.get()
    assert again.attempts == 2
    assert timedelta(seconds=3.5) < again.next_attempt_at - row.next_attempt_at
    # The node answers again: the next due attempt delivers it, and the row goes.
    monkeypatch.undo()
    clock(timedelta(seconds=10))
    assert outbox_deliver_due() == 1
    assert not Delivery.objects.exists() and outbox_next_attempt() is None
    assert len(holders(node)) == 2
    Reservation.objects.get(pk=reservation.pk, state="active")


def test_the_backoff_stops_growing_at_five_minutes(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:
    monkeypatch.setattr(sending, "daemon_deliver", unreachable)
    reservation_create(request=gpu_request(owned_pool, 1), actor="t")
    Delivery.objects.update(attempts=40)
    clock(timedelta(seconds=3))
    now = compute_now()
    assert outbox_deliver_due() == 0
    row = Delivery.objects.get()
    assert row.attempts == 41
    assert now < row.next_attempt_at <= now + timedelta(seconds=MAX_RETRY_SECONDS + 1)


def test_a_delivery_that_never_ran_after_commit_is_delivered_from_the_outbox(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:
    # The process died between its commit and the node: the on-commit delivery never ran.
    monkeypatch.setattr(outbox, "outbox_deliver_reservation", lambda **_: 0)
    reservation, _ = reservation_create(request=gpu_request(owned_pool, 2, resources={"vcpu": 4}), actor="t")
    assert holders(node) == {} and Delivery.objects.get().kind == "assign"
    clock(timedelta(seconds=3))
    assert outbox_deliver_due() == 1
    assert len(holders(node)) == 2 and daemon_claims(reservation_id=reservation.pk)[0].resources == {
        "vcpu": 4
    }
    assert outbox_deliver_due() == 0  # nothing left, nothing delivered twice


def test_an_on_commit_delivery_that_raises_leaves_the_row_for_the_worker(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:

    def broken(**_: Any) -> None:
        raise RuntimeError("the delivery code itself failed")

    monkeypatch.setattr(outbox, "_deliver_claimed", broken)
    reservation, created = reservation_create(request=gpu_request(owned_pool, 1), actor="t")
    assert created and Delivery.objects.filter(reservation_id=reservation.pk).exists()
    monkeypatch.undo()
    clock(timedelta(seconds=3))
    assert outbox_deliver_due() == 1
    assert len(holders(node)) == 1


_CHILD = """
import os, signal, sys
import django
django.setup()
from inventory.models import Pool
from reservations import services
from reservations.delivery import outbox
from tests.support.placement import gpu_request

def die(**_):
    # After COMMIT, before the node is told: the process is killed.
    os.kill(os.getpid(), signal.SIGKILL)

outbox.outbox_deliver_reservation = die
pool = Pool.objects.get(pk=sys.argv[1])
services.reservation_create(request=gpu_request(pool, 2, idempotency_key="killed"), actor="child")
"""


def test_a_process_killed_between_commit_and_delivery_loses_nothing(
    owned_pool: Pool, node: Node, clock: Callable[[timedelta], None]
) -> None:
    env = child_env_on_this_database()
    result = run_python("-c", _CHILD, owned_pool.pk, env=env, timeout=JOIN_SECONDS)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    reservation = Reservation.objects.get(idempotency_key="killed")
    assert reservation.state == "active" and holders(node) == {}
    assert list(Delivery.objects.values_list("reservation_id", "kind")) == [(reservation.pk, "assign")]
    clock(timedelta(seconds=3))
    assert outbox_deliver_due() == 1
    assert {held[0][0] for held in holders(node).values()} == {reservation.pk} and len(holders(node)) == 2


def test_a_reservations_rows_are_delivered_in_order_assign_before_shorten(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:
    sent: list[str] = []
    send = sending.delivery_send

    def failing(*, reservation_id: str, kind: str) -> None:
        raise Unreachable(kind)

    def recording(*, reservation_id: str, kind: str) -> None:
        sent.append(kind)
        send(reservation_id=reservation_id, kind=kind)

    monkeypatch.setattr(sending, "delivery_send", failing)
    reservation, _ = reservation_create(request=gpu_request(owned_pool, 1, resources={"vcpu": 2}), actor="t")
    reservation_release(reservation=reservation, actor="t")
    assert list(Delivery.objects.order_by("id").values_list("kind", flat=True)) == ["assign", "shorten"]
    monkeypatch.setattr(sending, "delivery_send", recording)
    clock(timedelta(seconds=30))
    assert outbox_deliver_due() == 2
    assert sent == ["assign", "shorten"]
    # The node learnt of it and of its end: nothing live stays behind on it.
    released = Reservation.objects.get(pk=reservation.pk)
    assert all(end <= released.released_at for held in holders(node).values() for _, _, end in held)
    assert all(c.ends_at <= released.released_at for c in daemon_claims(reservation_id=reservation.pk))


def test_two_workers_never_deliver_one_reservation_at_once(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, clock: Callable[[timedelta], None]
) -> None:
    monkeypatch.setattr(outbox, "outbox_deliver_reservation", lambda **_: 0)
    first, _ = reservation_create(request=gpu_request(owned_pool, 1), actor="t")
    second, _ = reservation_create(request=gpu_request(owned_pool, 1), actor="t")
    monkeypatch.undo()
    send = sending.delivery_send
    lock = threading.Lock()
    inside: dict[str, int] = {}
    most: dict[str, int] = {}
    calls: list[str] = []
    holding = threading.Event()
    go_on = threading.Event()

    def instrumented(*, reservation_id: str, kind: str) -> None:
        with lock:
            inside[reservation_id] = inside.get(reservation_id, 0) + 1
            most[reservation_id] = max(most.get(reservation_id, 0), inside[reservation_id])
            calls.append(reservation_id)
        if reservation_id == first.pk:
            holding.set()
            assert go_on.wait(JOIN_SECONDS)
        send(reservation_id=reservation_id, kind=kind)
        with lock:
            inside[reservation_id] -= 1

    monkeypatch.setattr(sending, "delivery_send", instrumented)

    def worker() -> int:
        set_clock_offset(timedelta(seconds=30))
        try:
            return outbox_deliver_due()
        finally:
            connections.close_all()

    # The first worker holds the first reservation's delivery open ...
    held = Worker(worker)
    held.start()
    assert holding.wait(JOIN_SECONDS)
    # ... and a second worker skips it and delivers the other one.
    clock(timedelta(seconds=30))
    assert outbox_deliver_due() == 1
    go_on.set()
    held.join_ok()
    assert held.result in (1, 2)
    assert sorted(calls) == sorted([first.pk, second.pk]) and most == {first.pk: 1, second.pk: 1}
    assert not Delivery.objects.exists()
    assert outbox_deliver_due() == 0


# --- What the node has: its scalar capacity (the refusal itself: tests/guarantees/test_guard_delivery.py) ---


def test_claims_of_a_release_the_node_has_not_heard_of_yet_do_not_refuse_the_next_create(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = reservation_create(request=gpu_request(owned_pool, 1, resources={"vcpu": 16}), actor="t")
    # The release commits; its news does not reach the node (the shorten is lost on the way).
    monkeypatch.setattr(sending, "daemon_shorten", lambda **_: None)
    reservation_release(reservation=first, actor="t")
    monkeypatch.undo()
    assert daemon_claims(reservation_id=first.pk)[0].ends_at > compute_now()
    second, _ = reservation_create(request=gpu_request(owned_pool, 1, resources={"vcpu": 16}), actor="t")
    assert Reservation.objects.get(pk=second.pk).state == "active"
    # The node brought its record of the first up to date before it accepted the second.
    assert daemon_claims(reservation_id=first.pk)[0].ends_at <= compute_now()


def test_over_http_the_node_is_told_after_the_response_has_gone_out(
    owned_pool: Pool, node: Node, monkeypatch: pytest.MonkeyPatch, live_server: Any
) -> None:
    import requests

    from core.services import token_issue

    sent = outbox.outbox_deliver_reservation
    delivering = threading.Event()
    may_deliver = threading.Event()
    delivered: list[str] = []

    def held_up(*, reservation_id: str) -> int:
        # The server's thread is here, telling the node, while the client already has its answer.
        delivering.set()
        assert may_deliver.wait(JOIN_SECONDS)
        count = sent(reservation_id=reservation_id)
        delivered.append(reservation_id)
        return count

    monkeypatch.setattr(outbox, "outbox_deliver_reservation", held_up)
    _, token = token_issue(tenant_id=owned_pool.owner_id, role="member")
    response = requests.post(
        f"{live_server.url}/api/compute/reservations/create",
        json=reservation_body(owned_pool, owned_pool.owner_id, "after-response"),
        headers={"Authorization": f"Bearer {token}"},
        timeout=JOIN_SECONDS,
    )
    # The answer arrived while the delivery had not finished (it cannot, until we let it).
    assert response.status_code == 201, response.text
    assert delivered == []
    assert delivering.wait(JOIN_SECONDS)
    may_deliver.set()
    deadline = threading.Event()
    for _ in range(int(JOIN_SECONDS / 0.05)):
        if delivered:
            break
        deadline.wait(0.05)
    assert delivered == [response.json()["id"]]
    assert len(holders(node)) == 2
    assert not Delivery.objects.exists()
