"""Each family of `GET /metrics`, read through a scrape after the API or the worker's records changed it.

The database's families are compared with what the API answers (`capacity/byPool`)
or with the rows the test wrote; the process's counters are read as differences
between two scrapes, since they count for the whole test process.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.services import audit_record
from core.worker_status import HEARTBEAT_ROW, worker_job_finished
from inventory.models import Node, Pool
from operations.metrics import events
from reservations.models import Delivery, Reservation, WaitSlot
from reservations.placer import option
from reservations.rollups.recount import rollup_rebuild
from tests.monitoring.metrics import scrape, value
from tests.support.api import post, post_json, reservation_body
from tests.support.placement import gpu_request, make_node
from tests.support.races import attempt, hold_two_placements_until_both_planned
from tests.support.threads import workers_run

pytestmark = pytest.mark.django_db

COLUMNS = ("total", "allocatable", "allocated", "reserved", "available")
BUCKETS = ("provisioning", "unhealthy", "maintenance", "unreachable")


@pytest.fixture(autouse=True)
def fresh_event_counts() -> None:
    # The settled counts are the process's; each test's database starts over.
    events.forget()


def by_pool_gpu_row(client: APIClient, pool: Pool) -> dict[str, Any]:
    status, body = post_json(client, "capacity/byPool", {"tenantId": pool.owner_id, "poolId": pool.id})
    assert status == 200, body
    (row,) = [row for row in body["rows"] if row["resource"] == "gpu"]
    return dict(row)


def test_capacity_columns_equal_by_pool_after_a_create(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    make_node(owned_pool, gpus=8, cordoned=True)
    rollup_rebuild(pool_id=owned_pool.id)
    created = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=3))
    assert created.status_code == 201, created.json()
    row = by_pool_gpu_row(owner_client, owned_pool)
    samples = scrape()
    labels = {"pool_id": owned_pool.id, "pool": "h100-east", "owner": "acme", "gpu_model": "H100"}
    for column in COLUMNS:
        got = value(samples, "better_compute_pool_capacity", **labels, resource="gpu", column=column)
        assert got == row[column], column
    buckets = {
        b: value(samples, "better_compute_pool_capacity", pool_id=owned_pool.id, resource="gpu", column=b)
        for b in BUCKETS
    }
    assert buckets == {"provisioning": 0, "unhealthy": 0, "maintenance": 8, "unreachable": 0}
    assert row["allocated"] == 3 and row["available"] == 5


def test_at_risk_reservations_per_pool_with_a_zero_series_for_every_pool(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.id)
    assert value(scrape(), "better_compute_pool_at_risk_reservations", pool_id=owned_pool.id) == 0
    assert ("pool_id", owned_pool.id) in {
        (k, v)
        for labels, _ in scrape()["better_compute_pool_at_risk_reservations"]
        for k, v in labels.items()
    }
    post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=1))
    Reservation.objects.update(at_risk_since=gpu_node.created_at, at_risk_reason="node cordoned")
    assert value(scrape(), "better_compute_pool_at_risk_reservations", pool_id=owned_pool.id) == 1


def test_nodes_by_state_connectivity_and_bucket(owned_pool: Pool, gpu_node: Node) -> None:
    make_node(owned_pool, gpus=1, cordoned=True)
    make_node(owned_pool, gpus=1, connectivity="disconnected")
    make_node(owned_pool, gpus=1, provision_state="deploying")
    samples = scrape()

    def nodes(**labels: str) -> float:
        return value(samples, "better_compute_nodes", pool_id=owned_pool.id, pool="h100-east", **labels)

    assert nodes(bucket="schedulable", connectivity="connected", provision_state="deployed") == 1
    assert nodes(bucket="maintenance") == 1
    assert nodes(bucket="unreachable", connectivity="disconnected") == 1
    assert nodes(bucket="provisioning", provision_state="deploying") == 1


def test_nodes_judged_against_their_own_pools_owner_and_none_of_an_archived_pool(
    owned_pool: Pool, gpu_node: Node, archived_pool: Pool, outsider_tenant: Any
) -> None:
    # The pool's owner is joined after the nodes are grouped: each group must still meet its own pool's.
    make_node(owned_pool, gpus=1, trust="tenant-owned", owner_id=owned_pool.owner_id)
    make_node(owned_pool, gpus=1, trust="tenant-owned", owner_id=outsider_tenant.id)
    make_node(archived_pool, gpus=1)
    samples = scrape()
    ours = [
        (labels, v) for labels, v in samples["better_compute_nodes"] if labels["pool_id"] == owned_pool.id
    ]
    by_bucket = {labels["bucket"]: v for labels, v in ours}
    assert by_bucket == {"schedulable": 2, "excluded": 1}
    for family in ("better_compute_nodes", "better_compute_pool_at_risk_reservations"):
        assert archived_pool.id not in {labels["pool_id"] for labels, _ in samples[family]}


def test_capacity_labels_are_escaped_once_per_row_and_right_on_every_column(
    owned_pool: Pool, gpu_node: Node
) -> None:
    Pool.objects.filter(pk=owned_pool.pk).update(name='h100 "east"\\1')
    rollup_rebuild(pool_id=owned_pool.id)
    samples = scrape()
    assert value(samples, "better_compute_pool_capacity", pool='h100 "east"\\1', column="total") == 8
    rows = [
        labels for labels, _ in samples["better_compute_pool_capacity"] if labels["pool_id"] == owned_pool.id
    ]
    assert {labels["column"] for labels in rows} >= set(COLUMNS) | set(BUCKETS)
    assert {labels["pool"] for labels in rows} == {'h100 "east"\\1'}


def test_worker_jobs_lag_duration_and_behind(db: Any) -> None:
    # No worker has ever run: behind, as /healthz says.
    assert value(scrape(), "better_compute_worker_behind") == 1
    assert value(scrape(), "better_compute_worker_last_pass_age_seconds") == -1
    worker_job_finished(name="bookings-advance", holder="test", seconds=0.25, count=3)
    worker_job_finished(name="repair", holder="test", seconds=1.5, count=0, error="boom")
    worker_job_finished(name=HEARTBEAT_ROW, holder="test", seconds=0.0, count=0)
    samples = scrape()
    duration = "better_compute_worker_job_last_duration_seconds"
    assert value(samples, duration, worker_job="bookings-advance") == 0.25
    assert value(samples, "better_compute_worker_job_lag_seconds", worker_job="bookings-advance") == 0
    assert value(samples, "better_compute_worker_job_failing", worker_job="repair") == 1
    # A job that never succeeded has no lag to tell: -1.
    assert value(samples, "better_compute_worker_job_lag_seconds", worker_job="repair") == -1
    assert 0 <= value(samples, "better_compute_worker_last_pass_age_seconds") < 60
    assert value(samples, "better_compute_worker_behind") == 1  # `repair` never succeeded


def test_outbox_rows_and_the_age_of_the_oldest(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    assert value(scrape(), "better_compute_outbox_rows") == 0
    assert value(scrape(), "better_compute_outbox_oldest_age_seconds") == 0
    post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=1))
    reservation = Reservation.objects.get()
    Delivery.objects.create(reservation=reservation, kind="assign")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_delivery SET created_at = compute_now() - interval '90 seconds'")
    samples = scrape()
    assert value(samples, "better_compute_outbox_rows") == Delivery.objects.count()
    assert 90 <= value(samples, "better_compute_outbox_oldest_age_seconds") < 120


def test_creates_waiting_counts_live_wait_slots_only(db: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT compute_now()")
        now = cursor.fetchone()[0]
    WaitSlot.objects.create(tenant_id="acme", slot=0, holder="a", expires_at=now + timedelta(seconds=30))
    WaitSlot.objects.create(tenant_id="acme", slot=1, holder="b", expires_at=now + timedelta(seconds=30))
    WaitSlot.objects.create(tenant_id="beta", slot=0, holder="c", expires_at=now - timedelta(seconds=1))
    assert value(scrape(), "better_compute_creates_waiting") == 2


def test_events_are_counted_from_the_audit_trail_and_never_go_down(db: Any) -> None:
    def record(action: str, actor: str = "worker") -> None:
        audit_record(actor=actor, action=action, subject_type="reservation", subject_id="r")

    record("reservation.repaired")
    record("reservation.at-risk")
    record("node.disconnected")
    record("reservation.release", actor="node")  # guard 6: the node refused
    record("reservation.release", actor="acme <principal_1>")  # a tenant's release: no event
    record("device.reported-unhealthy")

    def counts() -> dict[str, float]:
        samples = scrape()
        return {labels["event"]: v for labels, v in samples["better_compute_events_total"]}

    assert counts() == {
        "reservation_moved": 1,
        "reservation_at_risk": 1,
        "node_disconnected": 1,
        "node_refusal": 1,
        "device_unhealthy": 1,
    }
    # Older rows settle (counted once, then kept by the process); newer ones are counted per scrape.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE core_auditevent SET at = compute_now() - interval '10 minutes'")
    assert counts()["reservation_moved"] == 1
    assert events._settled.upto > 0
    record("reservation.repaired")
    assert counts()["reservation_moved"] == 2
    assert counts()["reservation_moved"] == 2


def test_the_event_counts_settle_mark_is_computed_once_however_many_rows_are_new(db: Any) -> None:
    """A mass repair writes thousands of audit rows the table's statistics do not know yet: the
    scrape's count must not compute its settle mark again for each of them (it once took seconds)."""
    insert = (
        "INSERT INTO core_auditevent (at, actor, action, subject_type, subject_id, reason, data)"
        " SELECT compute_now() - make_interval(secs => g), 'test', %s, 'reservation', 'r' || g,"
        " '', '{}'::jsonb FROM generate_series(1, %s) g"
    )
    with connection.cursor() as cursor:
        # The statistics as a quiet day left them: no counted action in the trail.
        cursor.execute(insert, ["reservation.create", 50])
        cursor.execute("ANALYZE core_auditevent")
        cursor.execute(insert, ["reservation.at-risk", 2000])
        params = {"after": 0, "settle": events.SETTLE_SECONDS, "actions": list(events.EVENTS_ACTIONS)}
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + events.COUNT_SQL, params)
        (plan,) = cursor.fetchone()

    def aggregate_loops(node: dict[str, Any]) -> list[int]:
        own = (
            [node["Actual Loops"]]
            if node["Node Type"] == "Aggregate" and node.get("Strategy") == "Plain"
            else []
        )
        return own + [loops for child in node.get("Plans", []) for loops in aggregate_loops(child)]

    assert aggregate_loops(plan[0]["Plan"]) == [1]


def test_request_latency_by_method_and_status_and_create_outcomes(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.id)
    before = scrape()
    body = reservation_body(owned_pool, "acme", key="k1", gpus=2)
    assert post(owner_client, "reservations/create", body).status_code == 201
    assert post(owner_client, "reservations/create", body).status_code == 200  # the idempotent replay
    too_big = reservation_body(owned_pool, "acme", key="k2", gpus=64)
    assert post(owner_client, "reservations/create", too_big).status_code == 409
    post(owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.id})
    post(owner_client, "capacity/byPool", {"tenantId": "acme", "poolId": owned_pool.id})
    post(owner_client, "nosuch/method", {})
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    count = "better_compute_api_request_duration_seconds_count"
    assert delta(count, method="capacity/byPool", status="200") == 2
    assert delta(count, method="reservations/create", status="201") == 1
    assert delta(count, method="reservations/create", status="409") == 1
    # An unknown path is not a method: no series is made for it.
    assert not [labels for labels, _ in after[count] if labels["method"].startswith("nosuch")]
    outcomes = "better_compute_reservation_creates_total"
    assert delta(outcomes, outcome="created") == 1
    assert delta(outcomes, outcome="replayed") == 1
    assert delta(outcomes, outcome="NO_CAPACITY") == 1
    assert delta("better_compute_placement_duration_seconds_count") == 2


def test_rate_limited_answers_are_counted(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node, settings: Any
) -> None:
    settings.API_WRITES_PER_MINUTE_PER_TOKEN = 1
    before = scrape()
    post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", key="a", gpus=1))
    refused = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", key="b", gpus=1))
    assert refused.status_code == 429
    after = scrape()
    name = "better_compute_rate_limited_total"
    assert (
        value(after, name, method="reservations/create") - value(before, name, method="reservations/create")
        == 1
    )
    outcome = "better_compute_reservation_creates_total"
    assert value(after, outcome, outcome="RATE_LIMITED") - value(before, outcome, outcome="RATE_LIMITED") == 1


@pytest.mark.django_db(transaction=True)
def test_a_lost_race_is_a_replan(owned_pool: Pool) -> None:
    """Two creates planned onto the one free GPU: one books it, the other replans and finds none."""
    one_gpu = make_node(owned_pool, gpus=1)
    rollup_rebuild(pool_id=owned_pool.id)
    before = scrape()
    option.HOOKS.clear()
    hold_two_placements_until_both_planned(option.HOOKS)
    try:
        workers = workers_run([attempt(gpu_request(owned_pool, 1)) for _ in range(2)])
    finally:
        option.HOOKS.clear()
    results = sorted(type(worker.result).__name__ for worker in workers)
    assert results == ["NoCapacity", "ReservationCreated"], results
    after = scrape()
    assert (
        value(after, "better_compute_placement_replans_total")
        - value(before, "better_compute_placement_replans_total")
        >= 1
    )
    # One placement per create, and one more for a create that lost after writing and restarted.
    name = "better_compute_placement_duration_seconds_count"
    assert 2 <= value(after, name) - value(before, name) <= 3
    assert one_gpu.devices.count() == 1
