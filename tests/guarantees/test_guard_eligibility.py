"""Guard 4, attacked with real connections in threads: eligibility is linearizable.

A node flip (cordon, taint, maintenance, health, liveness) and a placement race; whichever commits
first is seen by the other. The races are held with the gates of `tests.support.races`.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from core.errors import NoCapacity
from inventory.models import Device, Node
from reservations.models import DeviceBooking
from reservations.services import ReservationCreated
from tests.support.factories import PoolFactory
from tests.support.placement import gpu_request
from tests.support.races import Hooks, attempt, gate, one_node, placement_held_after_its_locks
from tests.support.threads import started_until_blocked, transaction_held_open


def _cordon(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(cordoned=True, cordon_reason="test")


def _taint(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(noschedule_taints=1)


def _maintenance(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(maintenance=True)


def _unhealthy(node: Node) -> None:
    Device.objects.filter(node=node).update(healthy=False)


def _disconnect(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(connectivity="disconnected")


FLIPS = {
    "cordon": _cordon,
    "taint": _taint,
    "maintenance": _maintenance,
    "health": _unhealthy,
    "liveness": _disconnect,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_guard4_a_flip_that_commits_first_is_seen_by_the_placement(flip: str) -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    op, go_commit = transaction_held_open(lambda: FLIPS[flip](node), commit=gate())
    # The placement plans on the old snapshot (the flip is not committed yet),
    # then its FOR SHARE lock waits for the operator's row lock.
    placer = started_until_blocked(attempt(gpu_request(pool, 1)))
    go_commit.set()
    op.finish()
    assert op.error is None
    result = placer.finish()
    # Re-checked under the lock, the node (or atom) is no longer eligible: no booking.
    assert isinstance(result, NoCapacity), result
    assert DeviceBooking.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_guard4_a_flip_that_commits_second_sees_the_placement(flip: str, hooks: Hooks) -> None:
    pool = PoolFactory()
    node = one_node(pool, 2)
    placer, go_on = placement_held_after_its_locks(hooks, gpu_request(pool, 1))
    hooks.clear()
    seen_by_operator: dict[str, int] = {}

    def operator() -> None:
        with transaction.atomic():
            FLIPS[flip](node)  # waits for the placement's FOR SHARE lock
            seen_by_operator["bookings"] = DeviceBooking.objects.filter(device__node=node).count()

    op = started_until_blocked(operator)
    go_on.set()
    result = placer.finish()
    assert isinstance(result, ReservationCreated) and result.created, result
    op.finish()
    assert op.error is None
    # The operator's write committed second and saw the booking made first.
    assert seen_by_operator["bookings"] == 1
