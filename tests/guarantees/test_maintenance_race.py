"""Maintenance windows against racing creates and the clock: no tenant booking is ever left inside a window,
and the worker puts the window's nodes in maintenance at `from` and takes them out at `to`, within 5 s.

The race: 16 creates over HTTP, each on its own connection, into a window being scheduled on one of three
nodes. The decision (docs/decisions.md, "Maintenance windows"): scheduling takes the nodes `FOR UPDATE`, so
a create either commits first (its booking is inside, and the schedule's repair moves it off the window's
nodes, or marks it at risk and reports it) or waits and then finds the window's bookings (guard 1). With
room elsewhere for every create, none is left inside.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections

from core.clock import compute_now
from core.services import token_issue
from inventory.models import Pool
from operations.invariants import check_no_tenant_booking_in_a_window
from reservations.maintenance.services import STUCK, maintenance_schedule
from reservations.models import MaintenanceWindow, Reservation
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import bearer_client, post_json, reservation_body
from tests.support.clock import HOUR_MS, now_ms
from tests.support.placement import make_node
from tests.support.threads import started_until_blocked, transaction_held_open, workers_race
from tests.worker.watch import Watcher, looping, wait_for
from worker.jobs import worker_jobs
from worker.loop import WorkerLoop

CREATES = 16
# The service's promise: time-driven work is done within this long after its deadline.
DEADLINE_SECONDS = 5.0


@pytest.mark.django_db(transaction=True)
def test_sixteen_racing_creates_never_leave_a_booking_inside_a_window_being_scheduled(
    owned_pool: Pool,
) -> None:
    nodes = [make_node(owned_pool, hostname=f"gpu-race-{i}") for i in range(3)]
    _, member = token_issue(tenant_id="acme", role="member", name="race acme")
    start = now_ms() + 2 * HOUR_MS
    from_at = compute_now() + timedelta(hours=1)

    def create(index: int) -> Any:
        def run() -> Any:
            client = bearer_client(member)
            body = reservation_body(owned_pool, "acme", f"race-{index}", gpus=1, duration=3600, start=start)
            return post_json(client, "reservations/create", body)

        return run

    def schedule() -> Any:
        impact = maintenance_schedule(
            node_ids=[nodes[0].pk], starts_at=from_at, ends_at=from_at + timedelta(hours=3), reason="race",
            actor="test",
        )  # fmt: skip
        return impact

    workers = workers_race([*[create(i) for i in range(CREATES)], schedule])
    for worker in workers:
        assert worker.error is None, worker.error
    answers = [w.result for w in workers[:CREATES]]
    assert [status for status, _ in answers] == [201] * CREATES, answers
    impact = workers[-1].result
    # Whatever got in first was moved off the window's nodes, never left in it.
    assert all(c.group == "moved" for c in impact.conflicts), impact.conflicts
    assert check_no_tenant_booking_in_a_window() == []
    connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_a_create_that_commits_while_the_window_waits_for_its_node_is_found_and_counted_as_before_it(
    owned_pool: Pool,
) -> None:
    """A row lock waited for `FOR UPDATE` does not stop a new `FOR SHARE` of the row in PostgreSQL: a
    create that began after the window's transaction began can commit before the window holds the node.
    The window then finds it inside (one node, nowhere to move: at risk), and it was made before the
    window: the window's `created_at` is when it held its nodes, not when its transaction began."""
    node = make_node(owned_pool)
    _, member = token_issue(tenant_id="acme", role="member", name="race acme")
    from_at = compute_now() + timedelta(hours=1)

    def placement_on_the_node() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM inventory_node WHERE id = %s FOR SHARE", [node.pk])

    def schedule() -> Any:
        return maintenance_schedule(
            node_ids=[node.pk], starts_at=from_at, ends_at=from_at + timedelta(hours=3), reason="race",
            actor="test",
        )  # fmt: skip

    holder, let_go = transaction_held_open(placement_on_the_node)
    scheduling = started_until_blocked(schedule)
    body = reservation_body(
        owned_pool, "acme", "in-between", gpus=1, duration=3600, start=now_ms() + 2 * HOUR_MS
    )
    status, created = post_json(bearer_client(member), "reservations/create", body)
    assert status == 201, created
    let_go.set()
    holder.join_ok()
    scheduling.join_ok()
    impact = scheduling.result
    assert [(c.reservation_id, c.group) for c in impact.conflicts] == [(created["id"], STUCK)]
    reservation = Reservation.objects.get(pk=created["id"])
    assert reservation.at_risk_since is not None
    window = MaintenanceWindow.objects.get()
    assert reservation.created_at < window.created_at == impact.window.created_at
    assert check_no_tenant_booking_in_a_window() == []
    connections.close_all()


def _gpu_row(client: Any, pool: Pool) -> dict[str, Any]:
    status, body = post_json(client, "capacity/byPool", {"tenantId": "acme", "poolId": pool.pk})
    assert status == 200, body
    return next(row for row in body["rows"] if row["resource"] == "gpu")


@pytest.mark.django_db(transaction=True)
def test_the_worker_puts_the_nodes_in_maintenance_at_from_and_back_at_to(
    settings: Any, owned_pool: Pool, operator_client: Any, owner_client: Any
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    node = make_node(owned_pool)
    rollup_rebuild(pool_id=owned_pool.pk)
    jobs = [job for job in worker_jobs() if job.name in ("maintenance-windows", "bookings-advance")]
    loop = WorkerLoop(jobs=jobs, observer=Watcher())
    with looping(loop):
        start = now_ms() + 2000
        end = start + 3000
        status, body = post_json(
            operator_client,
            "nodes/scheduleMaintenance",
            {"nodeIds": [node.pk], "from": start, "to": end, "reason": "firmware"},
        )
        assert status == 201, body
        # Before `from` the window counts nowhere.
        assert _gpu_row(owner_client, owned_pool)["maintenance"] == 0

        assert wait_for(lambda: _gpu_row(owner_client, owned_pool)["maintenance"] == 8)
        assert now_ms() <= start + DEADLINE_SECONDS * 1000
        row = _gpu_row(owner_client, owned_pool)
        assert (row["allocatable"], row["allocated"], row["reserved"]) == (0, 0, 0)

        assert wait_for(lambda: _gpu_row(owner_client, owned_pool)["maintenance"] == 0)
        assert now_ms() <= end + DEADLINE_SECONDS * 1000
        row = _gpu_row(owner_client, owned_pool)
        assert (row["allocatable"], row["available"]) == (8, 8)
    status, body = post_json(operator_client, "nodes/listMaintenance", {"includeEnded": True})
    assert [w["state"] for w in body["windows"]] == ["ended"]
