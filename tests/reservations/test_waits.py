"""Creates that wait for a release (`wait.timeoutMs`): woken by a release, holding no database connection
while they wait, limited per tenant, and no capacity once the wait is over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections

from core.errors import NoCapacity, TooManyRequests
from inventory.models import Node, Pool
from reservations.models import Reservation
from reservations.services import reservation_create, reservation_release
from reservations.waits import LISTENER
from tests.support.factories import DeviceFactory, NodeFactory, NodeResourceFactory, PoolFactory
from tests.support.placement import gpu_request


def one_gpu_held(**resources: int) -> tuple[Pool, Node, Reservation]:
    """A pool whose one node has one GPU (and scalar `resources`), and the reservation that holds the GPU."""
    pool = PoolFactory()
    node = NodeFactory(pool=pool)
    DeviceFactory(node=node)
    for resource, allocatable in resources.items():
        NodeResourceFactory(node=node, resource=resource, allocatable=allocatable)
    holder, _ = reservation_create(request=gpu_request(pool, 1), actor="t")
    return pool, node, holder


def wait_until(condition: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        time.sleep(0.01)


def drain_waiters(threads: list[threading.Thread], results: list[Any]) -> None:
    """Release whatever the waiters get until every one of them has its answer."""
    released: set[str] = set()
    deadline = time.monotonic() + 60
    while any(thread.is_alive() for thread in threads):
        assert time.monotonic() < deadline, "waiters did not finish"
        for made in [r for r in results if not isinstance(r, Exception)]:
            if made.reservation.pk not in released:
                reservation_release(reservation=made.reservation, actor="t")
                released.add(made.reservation.pk)
        time.sleep(0.02)


def backends_of_this_database() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def start_waiters(pool: Pool, count: int, tenant_key: str) -> tuple[list[threading.Thread], list[Any]]:
    """`count` creates of one GPU that wait up to 30 s, each on its own thread; what each got, as it comes."""
    results: list[Any] = []

    def waiter(index: int) -> None:
        try:
            results.append(
                reservation_create(
                    request=gpu_request(
                        pool, 1, wait_timeout_ms=30000, idempotency_key=f"{tenant_key}{index}"
                    ),
                    actor="t",
                )
            )
        except Exception as exc:  # reported to the main thread
            results.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=waiter, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


@pytest.mark.django_db(transaction=True)
def test_wait_timeout_is_satisfied_by_a_concurrent_release(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, node, holder = one_gpu_held(vcpu=8)

    threads, results = start_waiters(pool, 1, "waiter")
    wait_until(lambda: LISTENER.waiting() == 1)
    reservation_release(reservation=holder, actor="t")
    (thread,) = threads
    thread.join(60)
    assert not thread.is_alive()
    (value,) = results
    assert not isinstance(value, Exception), value
    reservation, created = value
    assert created and reservation.allocations.get().node_id == node.id


@pytest.mark.django_db(transaction=True)
def test_waiting_creates_hold_no_database_connection_and_a_release_wakes_them() -> None:
    pool, _, holder = one_gpu_held()
    LISTENER.start()  # the process's one listening connection, counted in the baseline
    before = backends_of_this_database()

    threads, results = start_waiters(pool, 5, "w")
    wait_until(lambda: LISTENER.waiting() == 5)
    # Five requests wait; once their attempts are over none of them holds a backend (the
    # main thread's is the baseline's). Held connections would keep the count up for good.
    wait_until(lambda: backends_of_this_database() <= before)

    reservation_release(reservation=holder, actor="t")
    # One of them gets the GPU; each release after that wakes the next one.
    drain_waiters(threads, results)
    assert [r for r in results if isinstance(r, Exception)] == []
    assert len(results) == 5


@pytest.mark.django_db(transaction=True)
def test_a_tenant_beyond_its_waiting_slots_is_told_to_retry_at_once_and_others_still_wait(
    settings: Any,
) -> None:
    settings.CAPACITY_WAITERS_PER_TENANT = 2
    pool, _, holder = one_gpu_held()

    threads, results = start_waiters(pool, 2, "a")
    wait_until(lambda: LISTENER.waiting() == 2)
    with pytest.raises(TooManyRequests) as refused:
        reservation_create(
            request=gpu_request(pool, 1, wait_timeout_ms=30000, idempotency_key="a3"), actor="t"
        )
    assert refused.value.retry_after >= 1
    # Another tenant's create still waits (its own slots).
    other, _, other_holder = one_gpu_held()
    other_threads, other_results = start_waiters(other, 1, "b")
    wait_until(lambda: LISTENER.waiting() == 3)

    reservation_release(reservation=holder, actor="t")
    reservation_release(reservation=other_holder, actor="t")
    drain_waiters(threads, results)
    drain_waiters(other_threads, other_results)
    assert [r for r in [*results, *other_results] if isinstance(r, Exception)] == []


@pytest.mark.django_db(transaction=True)
def test_wait_timeout_ends_in_no_capacity_without_a_release() -> None:
    pool, _, _ = one_gpu_held()
    with pytest.raises(NoCapacity):
        reservation_create(request=gpu_request(pool, 1, wait_timeout_ms=50), actor="t")
