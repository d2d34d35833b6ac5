"""Maintenance planned ahead, over HTTP: the dry run, windows held as bookings, and what they change.

A window refuses a create that overlaps it (NO_CAPACITY naming it) and lets one that ends at its
start through; a future reservation inside it is moved when there is room and marked at risk when
there is not; the dry run's numbers are what scheduling then does; windows are listed, shortened,
extended (refused naming the booking in the way) and cancelled, each audited; explain names them,
earliest jumps past them, and the rollups count a future window nowhere.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import DeviceBooking, MaintenanceWindow, Reservation
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import assert_error, invalid_fields, post_json, reservation_body
from tests.support.clock import HOUR_MS, now_ms
from tests.support.placement import make_node

SCHEDULE = "nodes/scheduleMaintenance"
PLAN = "nodes/planMaintenance"


def window_body(node_ids: list[str], start_ms: int, end_ms: int, reason: str = "firmware") -> dict[str, Any]:
    return {"nodeIds": node_ids, "from": start_ms, "to": end_ms, "reason": reason}


def create(
    client: APIClient, pool: Pool, key: str, *, start: int, duration: int, gpus: int = 1
) -> tuple[int, Any]:
    body = reservation_body(pool, "acme", key, gpus=gpus, start=start, duration=duration)
    return post_json(client, "reservations/create", body)


def schedule(operator: APIClient, node_ids: list[str], start: int, end: int, reason: str = "firmware") -> Any:
    status, body = post_json(operator, SCHEDULE, window_body(node_ids, start, end, reason))
    assert status == 201, body
    return body


def reservation(client: APIClient, reservation_id: str) -> Any:
    status, body = post_json(
        client, "reservations/get", {"tenantId": "acme", "reservationId": reservation_id}
    )
    assert status == 200, body
    return body


def gpu_row(client: APIClient, pool: Pool) -> dict[str, Any]:
    status, body = post_json(client, "capacity/byPool", {"tenantId": "acme", "poolId": pool.pk})
    assert status == 200, body
    return next(row for row in body["rows"] if row["resource"] == "gpu")


def tenant_bookings_in(window_id: str) -> int:
    window = MaintenanceWindow.objects.get(pk=window_id)
    nodes = list(window.members.values_list("node_id", flat=True))
    return DeviceBooking.objects.filter(
        purpose="allocation",
        device__node_id__in=nodes,
        during__overlap=(window.starts_at, window.ends_at),
        allocation__reservation__state__in=("scheduled", "active"),
    ).count()


@pytest.mark.django_db
def test_a_window_refuses_an_overlapping_create_naming_it_and_allows_one_that_ends_at_its_start(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.pk)
    start = now_ms() + 2 * HOUR_MS
    window = schedule(operator_client, [gpu_node.pk], start, start + 2 * HOUR_MS)["window"]
    assert (window["state"], window["nodeIds"], window["reason"]) == ("scheduled", [gpu_node.pk], "firmware")

    status, body = create(owner_client, owned_pool, "into", start=start - HOUR_MS, duration=7200)
    assert_error(status, body, "NO_CAPACITY", 409)
    assert f"maintenance window 'firmware' on {gpu_node.pk} from " in body["error"]["message"]

    status, body = create(owner_client, owned_pool, "before", start=start - HOUR_MS, duration=3600)
    assert status == 201, body
    # A future window counts in no bucket: only the tenant's GPU is reserved, 7 of 8 available.
    row = gpu_row(owner_client, owned_pool)
    assert (row["allocatable"], row["reserved"], row["available"], row["maintenance"]) == (8, 1, 7, 0)
    assert gpu_row(owner_client, owned_pool) == {**row} and rollup_rebuild(pool_id=owned_pool.pk)
    assert gpu_row(owner_client, owned_pool)["available"] == 7


@pytest.mark.django_db
def test_a_future_reservation_inside_is_moved_when_there_is_room(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    first, second = make_node(owned_pool), make_node(owned_pool)
    start = now_ms() + 2 * HOUR_MS
    status, created = create(owner_client, owned_pool, "moving", start=start, duration=3600, gpus=4)
    assert status == 201, created
    was = created["allocations"][0]["nodeId"]
    other = second.pk if was == first.pk else first.pk

    answer = schedule(operator_client, [was], start - HOUR_MS, start + 2 * HOUR_MS)
    moved = next(n for n in answer["nodes"] if n["nodeId"] == was)["moved"]
    assert [(m["reservationId"], m["toNodeIds"]) for m in moved] == [(created["id"], [other])]
    assert answer["tenants"] == [{"tenantId": "acme", "running": 0, "moved": 1, "stuck": 0}]
    got = reservation(owner_client, created["id"])
    assert [a["nodeId"] for a in got["allocations"]] == [other]
    assert got["atRisk"] is None
    assert tenant_bookings_in(answer["window"]["id"]) == 0


@pytest.mark.django_db
def test_a_future_reservation_inside_is_marked_at_risk_when_there_is_no_room(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    status, created = create(owner_client, owned_pool, "stuck", start=start, duration=3600)
    assert status == 201, created

    answer = schedule(operator_client, [gpu_node.pk], start - HOUR_MS, start + 2 * HOUR_MS)
    stuck = answer["nodes"][0]["stuck"]
    assert [s["reservationId"] for s in stuck] == [created["id"]]
    risk = reservation(owner_client, created["id"])["atRisk"]
    assert risk is not None and f"maintenance window 'firmware' on {gpu_node.pk}" in risk["reason"]
    assert AuditEvent.objects.filter(subject_id=created["id"], action="reservation.at-risk").exists()

    # Cancelled, the window gives the atoms back and the mark goes.
    status, body = post_json(operator_client, "nodes/cancelMaintenance", {"windowId": answer["window"]["id"]})
    assert status == 200 and body["state"] == "cancelled", body
    assert reservation(owner_client, created["id"])["atRisk"] is None


@pytest.mark.django_db
def test_the_dry_run_writes_nothing_and_its_numbers_are_what_scheduling_does(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    busy = make_node(owned_pool, hostname="gpu-busy")
    start = now_ms() + 2 * HOUR_MS
    # On the busy node: one reservation running now and three for later, two GPUs each.
    made = []
    for key, at in (("now", None), ("f1", start), ("f2", start), ("f3", start)):
        status, got = post_json(
            owner_client,
            "reservations/create",
            reservation_body(owned_pool, "acme", key, duration=3600, start=at),
        )
        assert status == 201, got
        made.append(got["id"])
    # A spare node with room for one of the three.
    make_node(owned_pool, hostname="gpu-spare", gpus=2)
    span = {"nodeIds": [busy.pk], "from": now_ms(), "to": start + HOUR_MS}
    windows_before, audits_before = MaintenanceWindow.objects.count(), AuditEvent.objects.count()
    bookings_before = list(DeviceBooking.objects.order_by("id").values_list("id", "device_id", "during"))

    status, plan = post_json(operator_client, PLAN, span)
    assert status == 200, plan
    assert MaintenanceWindow.objects.count() == windows_before
    assert AuditEvent.objects.count() == audits_before
    assert (
        list(DeviceBooking.objects.order_by("id").values_list("id", "device_id", "during")) == bookings_before
    )
    assert plan["tenants"] == [{"tenantId": "acme", "running": 1, "moved": 1, "stuck": 2}]
    gpu = next(p for p in plan["pools"] if p["resource"] == "gpu")
    # With the busy node, 10 GPUs less the 6 booked at the window's busiest instant; without it,
    # the spare's 2 less the one reservation moved there.
    assert (gpu["lowestAvailable"], gpu["lowestAvailableWithout"]) == (4, 0)

    answer = schedule(operator_client, [busy.pk], span["from"], span["to"])

    def groups(nodes: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[str, list[str]]]]]:
        return [
            (n["nodeId"], group, sorted((r["reservationId"], r["toNodeIds"]) for r in n[group]))
            for n in nodes
            for group in ("running", "moved", "stuck")
        ]

    assert groups(plan["nodes"]) == groups(answer["nodes"])
    assert plan["tenants"] == answer["tenants"]
    assert made[0] in [r["reservationId"] for r in answer["nodes"][0]["running"]]


@pytest.mark.django_db
def test_shorten_extend_and_cancel_each_audited_and_an_extension_into_a_booking_is_refused_naming_it(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    window = schedule(operator_client, [gpu_node.pk], start, start + 2 * HOUR_MS)["window"]
    status, after = create(owner_client, owned_pool, "after", start=start + 3 * HOUR_MS, duration=3600)
    assert status == 201, after

    status, body = post_json(
        operator_client, "nodes/updateMaintenance", {"windowId": window["id"], "to": start + 4 * HOUR_MS}
    )
    assert_error(status, body, "CONFLICT", 409)
    assert f"reservation {after['id']} of tenant acme on {gpu_node.pk}" in body["error"]["message"]

    status, body = post_json(
        operator_client, "nodes/updateMaintenance", {"windowId": window["id"], "to": start + HOUR_MS}
    )
    assert status == 200 and body["to"] == start + HOUR_MS, body
    # The hour given back is bookable again.
    status, body = create(owner_client, owned_pool, "freed", start=start + HOUR_MS, duration=3600)
    assert status == 201, body

    status, body = post_json(
        operator_client, "nodes/updateMaintenance", {"windowId": window["id"], "to": start + HOUR_MS + 60_000}
    )
    assert_error(status, body, "CONFLICT", 409)
    status, body = post_json(operator_client, "nodes/listMaintenance", {})
    assert status == 200 and [w["id"] for w in body["windows"]] == [window["id"]], body

    status, body = post_json(
        operator_client, "nodes/cancelMaintenance", {"windowId": window["id"], "reason": "moved"}
    )
    assert status == 200 and body["state"] == "cancelled", body
    status, body = post_json(operator_client, "nodes/listMaintenance", {})
    assert status == 200 and body["windows"] == []
    status, body = post_json(operator_client, "nodes/listMaintenance", {"includeEnded": True})
    assert [w["state"] for w in body["windows"]] == ["cancelled"]
    trail = list(
        AuditEvent.objects.filter(subject_id=window["id"]).order_by("id").values_list("action", flat=True)
    )
    assert trail == ["maintenance.scheduled", "maintenance.shortened", "maintenance.cancelled"]
    assert DeviceBooking.objects.filter(window_id=window["id"]).count() == 0
    # A cancelled window changes no more.
    status, body = post_json(operator_client, "nodes/cancelMaintenance", {"windowId": window["id"]})
    assert_error(status, body, "CONFLICT", 409)


@pytest.mark.django_db
def test_an_extension_into_free_time_holds_it(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    window = schedule(operator_client, [gpu_node.pk], start, start + HOUR_MS)["window"]
    status, body = post_json(
        operator_client, "nodes/updateMaintenance", {"windowId": window["id"], "to": start + 2 * HOUR_MS}
    )
    assert status == 200, body
    status, body = create(owner_client, owned_pool, "late", start=start + HOUR_MS, duration=1800)
    assert_error(status, body, "NO_CAPACITY", 409)
    assert AuditEvent.objects.filter(subject_id=window["id"], action="maintenance.extended").exists()


@pytest.mark.django_db
def test_explain_names_the_window_and_earliest_jumps_past_it(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    schedule(operator_client, [gpu_node.pk], start, start + 2 * HOUR_MS)
    body = reservation_body(owned_pool, "acme", "why", gpus=1, duration=3600, start=start)
    status, explained = post_json(owner_client, "capacity/explain", body)
    assert status == 200, explained
    reasons = [s["reason"] for s in explained["samples"]["noFreeAtoms"]]
    assert any("held by maintenance window 'firmware'" in r for r in reasons), reasons

    body = reservation_body(owned_pool, "acme", "when", gpus=1, duration=3 * 3600)
    body["from"] = now_ms()
    status, earliest = post_json(owner_client, "capacity/earliest", body)
    assert status == 200, earliest
    assert earliest["start"] >= start + 2 * HOUR_MS, earliest


@pytest.mark.django_db
def test_bad_input_is_the_contracts_envelope_and_changes_nothing(
    operator_client: APIClient, gpu_node: Node
) -> None:
    start = now_ms() + HOUR_MS
    bad = [
        {"nodeIds": [gpu_node.pk], "from": start, "to": start, "reason": "x"},
        {"nodeIds": [], "from": start, "to": start + HOUR_MS, "reason": "x"},
        {"nodeIds": ["nope"], "from": start, "to": start + HOUR_MS, "reason": "x"},
        {"nodeIds": [gpu_node.pk], "from": "soon", "to": start + HOUR_MS, "reason": "x"},
        {"nodeIds": [gpu_node.pk], "from": start, "to": start + HOUR_MS},
        {"nodeIds": [gpu_node.pk], "from": start, "to": start + HOUR_MS, "reason": "x", "extra": 1},
    ]
    for body in bad:
        status, answer = post_json(operator_client, SCHEDULE, body)
        assert invalid_fields(status, answer), answer
    past = {"nodeIds": [gpu_node.pk], "from": start - 3 * HOUR_MS, "to": start - 2 * HOUR_MS, "reason": "x"}
    assert invalid_fields(*post_json(operator_client, SCHEDULE, past)) == {"to"}
    status, answer = post_json(operator_client, PLAN, {"from": start, "to": start + HOUR_MS})
    assert invalid_fields(status, answer) == {"nodeIds"}
    status, answer = post_json(
        operator_client, SCHEDULE, window_body(["node_01k0000000000000000000000a"], start, start + HOUR_MS)
    )
    assert_error(status, answer, "NOT_FOUND", 404)
    status, answer = post_json(
        operator_client, "nodes/cancelMaintenance", {"windowId": "mw_01k0000000000000000000000a"}
    )
    assert_error(status, answer, "NOT_FOUND", 404)
    assert MaintenanceWindow.objects.count() == 0
    assert not DeviceBooking.objects.filter(purpose="maintenance").exists()
    assert not AuditEvent.objects.filter(action__startswith="maintenance.").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method", [PLAN, SCHEDULE, "nodes/listMaintenance", "nodes/updateMaintenance", "nodes/cancelMaintenance"]
)
def test_only_operators_plan_and_book_windows(
    owner_client: APIClient, node_agent_client: APIClient, gpu_node: Node, method: str
) -> None:
    start = now_ms() + HOUR_MS
    bodies = {
        PLAN: {"nodeIds": [gpu_node.pk], "from": start, "to": start + HOUR_MS},
        SCHEDULE: window_body([gpu_node.pk], start, start + HOUR_MS),
        "nodes/listMaintenance": {},
        "nodes/updateMaintenance": {"windowId": "mw_01k0000000000000000000000a", "to": start},
        "nodes/cancelMaintenance": {"windowId": "mw_01k0000000000000000000000a"},
    }
    for client in (owner_client, node_agent_client):
        status, answer = post_json(client, method, bodies[method])
        assert_error(status, answer, "PERMISSION_DENIED", 403)
    assert MaintenanceWindow.objects.count() == 0


@pytest.mark.django_db
def test_a_window_on_a_node_already_held_then_is_refused_naming_the_first(
    operator_client: APIClient, gpu_node: Node
) -> None:
    start = now_ms() + HOUR_MS
    first = schedule(operator_client, [gpu_node.pk], start, start + 2 * HOUR_MS)["window"]
    status, answer = post_json(
        operator_client, SCHEDULE, window_body([gpu_node.pk], start + HOUR_MS, start + 3 * HOUR_MS, "bios")
    )
    assert_error(status, answer, "CONFLICT", 409)
    assert first["id"] in answer["error"]["message"] and "'firmware'" in answer["error"]["message"]


@pytest.mark.django_db
def test_a_tenant_booking_released_inside_a_window_gives_its_atoms_to_the_window(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    status, created = create(owner_client, owned_pool, "held", start=start, duration=3600, gpus=8)
    assert status == 201, created
    window = schedule(operator_client, [gpu_node.pk], start, start + HOUR_MS)["window"]
    assert tenant_bookings_in(window["id"]) == 8
    status, body = post_json(
        owner_client, "reservations/release", {"tenantId": "acme", "reservationId": created["id"]}
    )
    assert status == 200, body
    status, body = create(owner_client, owned_pool, "sneak", start=start, duration=600)
    assert_error(status, body, "NO_CAPACITY", 409)
    assert Reservation.objects.filter(idempotency_key="sneak").count() == 0


@pytest.mark.django_db
def test_the_invariant_finds_a_tenant_booking_inside_a_window(
    operator_client: APIClient, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    from operations.invariants import check_no_tenant_booking_in_a_window

    start = now_ms() + 2 * HOUR_MS
    window = schedule(operator_client, [gpu_node.pk], start, start + HOUR_MS)["window"]
    assert check_no_tenant_booking_in_a_window() == []
    # A broken guard: the window's bookings gone, a create gets in.
    DeviceBooking.objects.filter(window_id=window["id"]).delete()
    status, created = create(owner_client, owned_pool, "in", start=start, duration=600)
    assert status == 201, created
    problems = check_no_tenant_booking_in_a_window()
    assert problems and created["id"] in problems[0] and window["id"] in problems[0], problems
