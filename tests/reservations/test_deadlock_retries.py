"""A create, a repair and a maintenance change that PostgreSQL picks as a deadlock's victim run again.

PostgreSQL breaks a lock cycle by failing one transaction with SQLSTATE 40P01;
its work is rolled back whole, and the application is to run it again. Here a
statement of the victim fails as PostgreSQL fails it (an `OperationalError`
whose cause carries the SQLSTATE), so the tests say exactly which statement
loses; that a real cycle is broken so is shown by the interleaved torture run
(`tests/guarantees/test_capacity_concurrency.py`), where creates, repairs and
windows meet node changes statement by statement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from core.retry import DEADLOCK_ATTEMPTS
from inventory.models import Node, Pool
from reservations.lifecycle.deadlines import reservation_settle_ended
from reservations.lifecycle.repair_sweep import bookings_repair
from reservations.models import DeviceBooking, Reservation
from reservations.rollups.recount import rollup_rebuild
from reservations.services import RELEASE_ATTEMPTS
from tests.support.api import assert_error, post_json, reservation_body
from tests.support.clock import HOUR_MS, now_ms

# The create's last guarded write (`ledger.services.quota`).
CHARGE = "SET used = q.used + c.amount"


class _Deadlock(Exception):
    sqlstate = "40P01"


@contextmanager
def statements_lose(marker: str, times: int) -> Iterator[list[str]]:
    """The first `times` statements whose SQL holds `marker` fail as a deadlock's victim does."""
    lost: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if marker in sql and len(lost) < times:
            lost.append(sql)
            raise OperationalError("deadlock detected") from _Deadlock()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield lost


def at_risk(client: APIClient, reservation_id: str) -> Any:
    status, body = post_json(
        client, "reservations/get", {"tenantId": "acme", "reservationId": reservation_id}
    )
    assert status == 200, body
    return body["atRisk"]


@pytest.mark.django_db(transaction=True)
def test_a_create_whose_charge_lost_a_deadlock_runs_again_and_books_once(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.pk)
    body = reservation_body(owned_pool, "acme", "victim", gpus=2)
    # The quota charge (with the rollup deltas riding in it) locks what node changes and other
    # creates lock too; a lost lock inside the placement is the placer's own (it tries the next option).
    with statements_lose(CHARGE, times=1) as lost:
        status, created = post_json(owner_client, "reservations/create", body)
    assert len(lost) == 1
    assert status == 201, created
    assert Reservation.objects.count() == 1
    assert DeviceBooking.objects.filter(purpose="allocation").count() == 2
    status, summary = post_json(
        owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.pk}
    )
    gpu = next(row for row in summary["rows"] if row["resource"] == "gpu")
    assert (gpu["allocated"], gpu["available"]) == (2, 6), gpu


@pytest.mark.django_db(transaction=True)
def test_a_create_that_loses_every_run_answers_503_and_writes_nothing(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    body = reservation_body(owned_pool, "acme", "victim", gpus=2)
    with statements_lose(CHARGE, times=DEADLOCK_ATTEMPTS) as lost:
        response = owner_client.post("/api/compute/reservations/create", body, format="json")
    assert len(lost) == DEADLOCK_ATTEMPTS
    # Transient, as a failover is: 503 with Retry-After, saying what happened, in the envelope.
    assert_error(response.status_code, response.json(), "INTERNAL", 503)
    assert response["Retry-After"] == "1"
    assert "met other writes on the same rows" in response.json()["error"]["message"]
    assert not Reservation.objects.exists() and not DeviceBooking.objects.exists()


# The repair's lock of the reservation it looks at (`reservations.lifecycle.repair._locked`).
REPAIR_LOCK = 'FOR UPDATE OF "reservations_reservation" SKIP LOCKED'


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("losses", "cleared_at_once"), [(1, True), (DEADLOCK_ATTEMPTS, False)])
def test_a_cancelled_window_stays_cancelled_when_the_repair_after_it_loses_deadlocks(
    operator_client: APIClient,
    owner_client: APIClient,
    owned_pool: Pool,
    gpu_node: Node,
    losses: int,
    cleared_at_once: bool,
) -> None:
    start = now_ms() + 2 * HOUR_MS
    status, created = post_json(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", "stuck", gpus=1, start=start),
    )
    assert status == 201, created
    window = {
        "nodeIds": [gpu_node.pk],
        "from": start - HOUR_MS,
        "to": start + 2 * HOUR_MS,
        "reason": "firmware",
    }
    status, scheduled = post_json(operator_client, "nodes/scheduleMaintenance", window)
    assert status == 201, scheduled
    assert at_risk(owner_client, created["id"]) is not None

    # The window's own transaction commits; the repair that clears the mark afterwards loses.
    with statements_lose(REPAIR_LOCK, times=losses) as lost:
        status, body = post_json(
            operator_client, "nodes/cancelMaintenance", {"windowId": scheduled["window"]["id"]}
        )
    assert len(lost) == losses
    assert status == 200 and body["state"] == "cancelled", body
    if cleared_at_once:
        # Lost once, the repair ran again at once and cleared the mark.
        assert at_risk(owner_client, created["id"]) is None
    else:
        # Lost every run: the mark waits for the worker's next sweep, which clears it.
        assert at_risk(owner_client, created["id"]) is not None
        bookings_repair()
        assert at_risk(owner_client, created["id"]) is None


# The rebuild's lock of the pool's rollup rows (`reservations.rollups.deltas.rollup_rows_lock`).
ROLLUP_LOCK = "SELECT id FROM pool_capacity_rollup"


@pytest.mark.django_db(transaction=True)
def test_a_rollup_rebuild_that_lost_a_deadlock_runs_again_and_counts(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    with statements_lose(ROLLUP_LOCK, times=1) as lost:
        rollup_rebuild(pool_id=owned_pool.pk)
    assert len(lost) == 1
    status, summary = post_json(
        owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.pk}
    )
    assert status == 200, summary
    gpu = next(row for row in summary["rows"] if row["resource"] == "gpu")
    assert gpu["allocatable"] == gpu_node.devices.filter(device_class="gpu").count() > 0, gpu


# The settlement's own write (`reservations.lifecycle.deadlines._SETTLED_SQL`).
SETTLE = "SET state = 'ended'"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("losses", "settled_at_once"), [(1, True), (RELEASE_ATTEMPTS, False)])
def test_a_settlement_that_lost_deadlocks_runs_again_or_waits_for_the_next_run(
    owner_client: APIClient,
    owned_pool: Pool,
    gpu_node: Node,
    clock: Callable[[timedelta], None],
    losses: int,
    settled_at_once: bool,
) -> None:
    body = reservation_body(owned_pool, "acme", "ends", gpus=1, duration="10m")
    status, created = post_json(owner_client, "reservations/create", body)
    assert status == 201, created
    clock(timedelta(minutes=10, seconds=1))
    with statements_lose(SETTLE, times=losses) as lost:
        settled = reservation_settle_ended()
    assert len(lost) == losses
    assert Reservation.objects.get(pk=created["id"]).state == ("ended" if settled_at_once else "active")
    assert settled == (1 if settled_at_once else 0)
    if not settled_at_once:
        # Left for the next run of the job, which settles it.
        assert reservation_settle_ended() == 1
        assert Reservation.objects.get(pk=created["id"]).state == "ended"
