"""Time-driven services on the database clock: lease expiry, settlement, the worker's deadlines and wake-ups.

Each service is called directly, as the worker calls it, with `compute_now()`
moved on this connection; what a user sees is read over HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.clock import compute_now, to_millis
from core.constants import WORKER_CHANNEL
from core.errors import NoCapacity
from inventory.models import NodeResource, Pool
from ledger.models import QuotaUsage
from reservations import services
from reservations.delivery.daemon import daemon_holdings
from reservations.lifecycle.deadlines import (
    lease_expire_due,
    reservation_settle_ended,
    reservations_next_deadline,
)
from reservations.models import Reservation
from reservations.services import (
    ReservationCreated,
    reservation_create,
    reservation_release,
    reservation_renew,
)
from reservations.waits import LISTENER, RELEASE_CHANNEL
from tests.support.api import post, reservation_body
from tests.support.factories import QuotaUsageFactory
from tests.support.notifications import listening
from tests.support.placement import gpu_request, make_node
from tests.support.threads import JOIN_SECONDS, Worker, transaction_held_open

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_node_records() -> None:
    """The fake daemon's tables have no model, so a flush between tests leaves them: start empty."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE fake_daemon_assignments, fake_daemon_claims")


def get(client: APIClient, reservation_id: str) -> dict[str, Any]:
    answer = post(client, "reservations/get", {"tenantId": "acme", "reservationId": reservation_id})
    assert answer.status_code == 200, answer.json()
    body: dict[str, Any] = answer.json()
    return body


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + JOIN_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        time.sleep(0.01)


def waiting_create(request: Any) -> Worker:
    """A create with `wait.timeoutMs` on its own thread, started once it is waiting."""
    worker = Worker(lambda: reservation_create(request=request, actor="waiter"))
    worker.start()
    wait_until(lambda: LISTENER.waiting() == 1 or not worker.is_alive())
    assert worker.is_alive(), f"the create did not wait: {worker.result or worker.error!r}"
    return worker


def assert_woken_and_created(waiter: Worker, by: str) -> None:
    """The waiting create ended with its reservation: woken `by` what gave capacity back, not timed out."""
    waiter.finish()
    assert not isinstance(waiter.error, NoCapacity), f"the create was not woken by {by}"
    assert waiter.error is None, waiter.error
    assert isinstance(waiter.result, ReservationCreated) and waiter.result.created


def quota_used(pool: Pool) -> dict[str, int]:
    return dict(QuotaUsage.objects.filter(pool=pool).values_list("resource", "used"))


# --- Leases ----------------------------------------------------------------------------------


def test_a_30s_lease_is_released_once_the_clock_passes_30s_and_not_before(
    owner_client: APIClient, owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    node = make_node(owned_pool, gpus=2)
    QuotaUsageFactory(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=8)
    created = post(
        owner_client, "reservations/create", reservation_body(owned_pool, "acme", "leased", leaseSeconds=30)
    )
    assert created.status_code == 201, created.json()
    leased = created.json()
    assert quota_used(owned_pool) == {"gpu": 2}

    clock(timedelta(seconds=29))
    assert lease_expire_due() == 0
    assert get(owner_client, leased["id"])["state"] == "active"

    clock(timedelta(seconds=31))
    with listening(RELEASE_CHANNEL) as waiters:
        assert lease_expire_due() == 1
        assert waiters.next() == owned_pool.id  # creates waiting on the pool wake
    answer = get(owner_client, leased["id"])
    assert answer["state"] == "released"
    assert quota_used(owned_pool) == {"gpu": 0}
    stopped = Reservation.objects.get(pk=leased["id"])
    assert stopped.release_reason == "lease expired"
    # The node heard of it: its record ends with the release.
    for uid in leased["allocations"][0]["atoms"]:
        assert [end for _, _, end in daemon_holdings(device_uid=uid)] == [stopped.released_at]
    assert node.devices.count() == 2
    assert lease_expire_due() == 0  # nothing twice


def test_a_renewed_lease_moves_its_deadline_and_wakes_the_worker(
    owner_client: APIClient, owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, gpus=1)
    reservation, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=30), actor="t")
    clock(timedelta(seconds=20))
    with listening(WORKER_CHANNEL) as worker:
        renewed = reservation_renew(reservation=reservation, actor="t")
        assert datetime.fromisoformat(worker.next()) == renewed.lease_expires_at
    clock(timedelta(seconds=31))
    assert lease_expire_due() == 0  # it was due at 30 s, renewed at 20 s: now due at 50 s
    assert reservations_next_deadline() == renewed.lease_expires_at
    clock(timedelta(seconds=51))
    assert lease_expire_due() == 1


def test_a_due_lease_another_transaction_holds_is_skipped_not_waited_for(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, gpus=2)
    held, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=30), actor="t")
    free, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=30), actor="t")
    holder, let_go = transaction_held_open(lambda: Reservation.objects.select_for_update().get(pk=held.pk))
    clock(timedelta(seconds=31))
    assert lease_expire_due() == 1
    assert Reservation.objects.get(pk=free.pk).state == "released"
    assert Reservation.objects.get(pk=held.pk).state == "active"
    let_go.set()
    holder.join_ok()
    assert lease_expire_due() == 1
    assert Reservation.objects.get(pk=held.pk).state == "released"


def test_each_lease_is_released_in_its_own_transaction(
    owned_pool: Pool, clock: Callable[[timedelta], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_node(owned_pool, gpus=2)
    first, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=30), actor="t")
    second, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=60), actor="t")
    cut = services.reservation_cut
    calls: list[str] = []

    def fails_on_the_second(**fields: Any) -> Any:
        calls.append(fields["reservation_id"])
        if fields["reservation_id"] == second.pk:
            raise RuntimeError("the second release failed")
        return cut(**fields)

    monkeypatch.setattr(services, "reservation_cut", fails_on_the_second)
    clock(timedelta(seconds=61))
    with pytest.raises(RuntimeError):
        lease_expire_due()
    assert calls == [first.pk, second.pk]
    # The first release committed on its own; the failed one left nothing half-done.
    assert Reservation.objects.get(pk=first.pk).state == "released"
    assert Reservation.objects.get(pk=second.pk).state == "active"
    monkeypatch.undo()
    assert lease_expire_due() == 1


def test_a_waiting_create_is_woken_by_a_lease_expiry(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, gpus=1)
    start_ms = to_millis(compute_now() + timedelta(hours=1))
    holder, _ = reservation_create(
        request=gpu_request(owned_pool, 1, start_ms=start_ms, lease_seconds=30), actor="t"
    )
    waiter = waiting_create(
        gpu_request(owned_pool, 1, start_ms=start_ms, wait_timeout_ms=30000, idempotency_key="waiter")
    )
    clock(timedelta(seconds=31))
    assert lease_expire_due() == 1
    assert_woken_and_created(waiter, by="the expiry")
    assert Reservation.objects.get(pk=holder.pk).state == "released"


# --- Settlement ------------------------------------------------------------------------------


def test_a_reservation_that_reached_its_end_gives_back_quota_and_scalars_after_settlement(
    owner_client: APIClient, owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    node = make_node(owned_pool, gpus=2, resources={"vcpu": 16})
    QuotaUsageFactory(pool=owned_pool, tenant=owned_pool.owner, resource="gpu", max=2)
    QuotaUsageFactory(pool=owned_pool, tenant=owned_pool.owner, resource="vcpu", max=16)
    created = post(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", "ends", gpus=2, duration="10m", resources={"vcpu": 8}),
    )
    assert created.status_code == 201, created.json()
    reservation_id = created.json()["id"]
    assert quota_used(owned_pool) == {"gpu": 2, "vcpu": 8}

    clock(timedelta(minutes=9))
    assert reservation_settle_ended() == 0
    assert quota_used(owned_pool) == {"gpu": 2, "vcpu": 8}

    clock(timedelta(minutes=10, seconds=1))
    with listening(RELEASE_CHANNEL) as waiters:
        assert reservation_settle_ended() == 1
        assert waiters.next() == owned_pool.id
    assert get(owner_client, reservation_id)["state"] == "ended"
    assert Reservation.objects.get(pk=reservation_id).state == "ended"
    assert quota_used(owned_pool) == {"gpu": 0, "vcpu": 0}
    assert NodeResource.objects.get(node=node, resource="vcpu").allocated == 0
    assert reservation_settle_ended() == 0  # nothing twice
    # The tenant can book again at once.
    again = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", "again", gpus=2))
    assert again.status_code == 201, again.json()


def test_a_waiting_create_is_woken_by_a_settlement(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, gpus=2, resources={"vcpu": 8})
    reservation_create(
        request=gpu_request(owned_pool, 1, resources={"vcpu": 8}, duration_seconds=600), actor="t"
    )
    # The node's vCPUs are claimed until the first one is settled, whatever the window.
    later = to_millis(compute_now() + timedelta(hours=1))
    waiter = waiting_create(
        gpu_request(
            owned_pool, 1, resources={"vcpu": 8}, start_ms=later, wait_timeout_ms=30000, idempotency_key="w"
        )
    )
    clock(timedelta(minutes=11))
    assert reservation_settle_ended() == 1
    assert_woken_and_created(waiter, by="the settlement")


# --- The worker's schedule and wake-ups ------------------------------------------------------


def test_the_next_deadline_is_the_earliest_live_lease_or_end(
    owned_pool: Pool, clock: Callable[[timedelta], None]
) -> None:
    make_node(owned_pool, gpus=4)
    assert reservations_next_deadline() is None
    long, _ = reservation_create(request=gpu_request(owned_pool, 1, duration_seconds=7200), actor="t")
    assert reservations_next_deadline() == long.ends_at
    short, _ = reservation_create(request=gpu_request(owned_pool, 1, duration_seconds=600), actor="t")
    assert reservations_next_deadline() == short.ends_at
    leased, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=60), actor="t")
    assert leased.lease_expires_at is not None
    assert reservations_next_deadline() == leased.lease_expires_at
    # A released reservation has no deadline any more.
    reservation_release(reservation=leased, actor="t")
    reservation_release(reservation=short, actor="t")
    assert reservations_next_deadline() == long.ends_at


LIVE_PREDICATE = "'scheduled'"


def _plan_and_indexes(cursor: Any, query: str) -> tuple[str, dict[str, str]]:
    """The query's plan, and each index it scans with that index's predicate ('' for a full index)."""
    cursor.execute("EXPLAIN " + query)
    plan = "\n".join(row[0] for row in cursor.fetchall())
    names = re.findall(
        r"(?:Index Scan|Index Only Scan)(?: Backward)? using (\w+)|Bitmap Index Scan on (\w+)", plan
    )
    used = sorted({a or b for a, b in names})
    cursor.execute(
        "SELECT c.relname, coalesce(pg_get_expr(i.indpred, i.indrelid), '') FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = ANY(%s)",
        [used],
    )
    return plan, dict(cursor.fetchall())


def test_the_deadline_queries_use_their_partial_indexes() -> None:
    """Both deadline reads scan only live reservations, through indexes whose predicate says so.

    Which live partial index the planner picks depends on the statistics that
    earlier tests' rows leave (`reservation_lease_live`, `reservation_live_ends`,
    `reservation_tenant_pool_live`...), so the test asks what every index in the
    plan covers instead of naming one: it holds on a fresh database and a reused one.
    """
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            plans = [
                _plan_and_indexes(cursor, query)
                for query in (
                    "SELECT min(lease_expires_at) FROM reservations_reservation"
                    " WHERE state IN ('scheduled', 'active') AND lease_expires_at IS NOT NULL",
                    "SELECT min(ends_at) FROM reservations_reservation"
                    " WHERE state IN ('scheduled', 'active')",
                )
            ]
        finally:
            cursor.execute("RESET enable_seqscan")
    for plan, indexes in plans:
        assert indexes, plan
        assert "Seq Scan" not in plan, plan
        for name, predicate in indexes.items():
            assert LIVE_PREDICATE in predicate and "ended" not in predicate, (name, predicate, plan)


def test_a_create_wakes_the_worker_with_its_nearest_deadline(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=2)
    with listening(WORKER_CHANNEL) as worker:
        reservation, _ = reservation_create(request=gpu_request(owned_pool, 1, lease_seconds=60), actor="t")
        deadline = datetime.fromisoformat(worker.next())
    # The nearest of what the worker must act on for it: here the delivery's retry
    # (due if the node was not told by then), before the lease and the end.
    assert reservation.created_at < deadline <= reservation.lease_expires_at  # type: ignore[operator]
    with listening(WORKER_CHANNEL) as worker:
        start_ms = to_millis(compute_now() + timedelta(hours=3))
        future, _ = reservation_create(request=gpu_request(owned_pool, 1, start_ms=start_ms), actor="t")
        assert datetime.fromisoformat(worker.next()) < future.starts_at
