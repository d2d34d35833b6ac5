"""16 clients filling a pool one GPU at a time: no create waits out a spot notice (issue 11, item 9).

With no spot reservation anywhere, nothing can be displaced, so every create
that succeeds is `active` from its own start. Before the fix, a create that
lost its races in the plain plan went on to the displace-mode plan, picked an
atom that was simply free and booked it a spot notice later (`scheduled`).
"""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import NoCapacity
from inventory.models import Device, Pool
from reservations.models import DeviceBooking, Reservation
from reservations.services import reservation_create
from tests.support.factories import PoolFactory
from tests.support.placement import gpu_request, make_node
from tests.support.threads import workers_race

CLIENTS = 16
# Few nodes with many GPUs: every client's plan picks the same next atom on the
# same node, so most lose one race after another and reach the displace mode.
NODES = 2
GPUS_PER_NODE = 8


def fill_one_gpu_at_a_time(pool: Pool) -> Any:
    def run() -> list[str]:
        made: list[str] = []
        while True:
            try:
                reservation, _ = reservation_create(request=gpu_request(pool, 1), actor="client")
            except NoCapacity:
                return made
            made.append(reservation.pk)

    return run


@pytest.mark.django_db(transaction=True)
def test_sixteen_clients_filling_a_pool_get_no_scheduled_reservation() -> None:
    pool = PoolFactory()
    Pool.objects.filter(pk=pool.pk).update(notice_seconds=30)
    for _ in range(NODES):
        make_node(pool, gpus=GPUS_PER_NODE)
    workers = workers_race([fill_one_gpu_at_a_time(pool) for _ in range(CLIENTS)])
    for worker in workers:
        assert worker.error is None, repr(worker.error)
    made = [rsv for worker in workers for rsv in worker.result]
    gpus = Device.objects.filter(node__pool=pool).count()
    # The pool is full, every GPU once.
    assert len(made) == gpus == NODES * GPUS_PER_NODE
    assert DeviceBooking.objects.filter(device__node__pool=pool).count() == gpus
    assert not Reservation.objects.filter(spot=True).exists()
    states = list(Reservation.objects.filter(pool=pool).values_list("state", flat=True))
    assert states.count("active") == gpus, states
    for reservation in Reservation.objects.filter(pool=pool):
        assert reservation.starts_at <= reservation.created_at, reservation.pk
