"""BookingRepair and at-risk reservations (issue 12, item 4), through the API where a user touches them.

A future booking on a node that leaves the schedulable set is placed again,
whole, on the same fabric, for the same window, with its quota unchanged and
the rollups equal to a rebuild; the old node's daemon record is cut and the new
one assigned. What cannot move is marked at risk with a reason, shown by
`reservations/get` and `list`, counted by `capacity/byPool`, and cleared once
its atoms are counted again (or it moved after all).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.clock import compute_now
from core.models import AuditEvent, Tenant
from inventory.models import Device, Node, Pool
from ledger.models import QuotaUsage
from operations.services import node_cordon
from reservations.delivery.daemon import daemon_holdings
from reservations.lifecycle.repair_sweep import bookings_repair, repair_candidates
from reservations.models import ROLLUP_COUNTS, Allocation, DeviceBooking, PoolCapacityRollup, Reservation
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import post_json, reservation_body
from tests.support.commands import run_command
from tests.support.factories import QuotaUsageFactory
from tests.support.placement import make_node
from tests.support.threads import workers_race
from tests.support.torture.checks import check_no_double_booking, check_quota, check_scalars
from tests.support.torture.repair_checks import check_repaired

HOUR_MS = 3_600_000


def rollups(pool: Pool) -> dict[str, tuple[int, ...]]:
    """The pool's stored rollup counts, per resource."""
    return {
        row.resource: tuple(getattr(row, name) for name in ROLLUP_COUNTS)
        for row in PoolCapacityRollup.objects.filter(pool=pool)
    }


def assert_rollups_equal_a_rebuild(pool: Pool) -> None:
    before = rollups(pool)
    rollup_rebuild(pool_id=pool.id)
    assert rollups(pool) == before


def quota_used(pool: Pool, tenant: Tenant) -> dict[str, int]:
    return dict(QuotaUsage.objects.filter(pool=pool, tenant=tenant).values_list("resource", "used"))


def nodes_of(reservation_id: str) -> list[str]:
    return sorted(Allocation.objects.filter(reservation_id=reservation_id).values_list("node_id", flat=True))


def create(client: APIClient, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = post_json(client, "reservations/create", body)
    assert status == 201, answer
    return answer


def get(client: APIClient, tenant_id: str, reservation_id: str) -> dict[str, Any]:
    status, answer = post_json(
        client, "reservations/get", {"tenantId": tenant_id, "reservationId": reservation_id}
    )
    assert status == 200, answer
    return answer


def at_risk_count(client: APIClient, tenant_id: str, pool: Pool) -> int:
    status, answer = post_json(client, "capacity/byPool", {"tenantId": tenant_id, "poolId": pool.id})
    assert status == 200, answer
    return int(answer["atRiskReservations"])


def operate(client: APIClient, method: str, body: dict[str, Any]) -> None:
    status, answer = post_json(client, method, body)
    assert status == 200, answer


def held(node_id: str, reservation_id: str) -> int:
    """How many of the node's atoms its daemon believes it runs for the reservation."""
    return sum(
        1
        for uid in Device.objects.filter(node_id=node_id).values_list("uid", flat=True)
        for holder, _start, _end in daemon_holdings(device_uid=uid)
        if holder == reservation_id
    )


def later_ms(hours: float) -> int:
    return int((compute_now() + timedelta(hours=hours)).timestamp() * 1000)


def a_gang_on_two_of_three_fabric_nodes(
    pool: Pool, tenant: Tenant, client: APIClient
) -> tuple[dict[str, Any], list[str], str]:
    """Three nodes on fabric ib-1 and one on ib-2, quotas for `tenant`, and its gang of two 8-GPU nodes
    booked from two hours on for three: (the gang as created, its two nodes, the fabric's third node)."""
    fabric = [
        make_node(pool, hostname=f"ib1-{i}", labels={"fabric": "ib-1"}, resources={"vcpu": 64})
        for i in range(3)
    ]
    lone = make_node(pool, hostname="ib2-0", labels={"fabric": "ib-2"}, resources={"vcpu": 64})
    for resource, limit in (("gpu", 32), ("vcpu", 64)):
        QuotaUsageFactory(pool=pool, tenant=tenant, resource=resource, max=limit)
    rollup_rebuild(pool_id=pool.id)
    gang_of_two = {"size": 2, "topologyKey": "fabric"}
    body = reservation_body(
        pool,
        tenant.id,
        "gang-1",
        gpus=8,
        gang=gang_of_two,
        resources={"vcpu": 16},
        start=later_ms(2),
        duration="3h",
    )
    gang = create(client, body)
    first = sorted(a["nodeId"] for a in gang["allocations"])
    assert len(first) == 2 and lone.pk not in first
    (spare,) = [n.pk for n in fabric if n.pk not in first]
    return gang, first, spare


@pytest.mark.django_db(transaction=True)
def test_a_gangs_future_booking_moves_off_a_cordoned_node_within_its_fabric_or_is_marked_at_risk(
    owned_pool: Pool,
    offered_tenant: Tenant,
    offered_client: APIClient,
    operator_client: APIClient,
) -> None:
    pool = owned_pool
    gang, first, spare = a_gang_on_two_of_three_fabric_nodes(pool, offered_tenant, offered_client)
    quota = quota_used(pool, offered_tenant)
    assert quota == {"gpu": 16, "vcpu": 32}
    assert gang["atRisk"] is None and held(first[0], gang["id"]) == 8

    # One gang node is cordoned: the gang moves to the other two nodes of its fabric.
    operate(operator_client, "nodes/cordon", {"nodeId": first[0], "reason": "PSU swap"})
    assert bookings_repair() == 1
    moved = nodes_of(gang["id"])
    assert moved == sorted([first[1], spare])
    answer = get(offered_client, "beta", gang["id"])
    assert answer["atRisk"] is None
    assert (answer["start"], answer["end"]) == (gang["start"], gang["end"])
    assert sorted(a["nodeId"] for a in answer["allocations"]) == moved
    assert all(len(a["atoms"]) == 8 and a["resources"] == {"vcpu": 16} for a in answer["allocations"])
    assert quota_used(pool, offered_tenant) == quota
    assert_rollups_equal_a_rebuild(pool)
    assert (held(first[0], gang["id"]), held(spare, gang["id"]), held(first[1], gang["id"])) == (0, 8, 8)
    event = AuditEvent.objects.get(action="reservation.repaired", subject_id=gang["id"])
    assert (event.data["fromNodes"], event.data["toNodes"]) == (first, moved)
    assert event.reason.startswith("node ib1-") and "is cordoned: PSU swap" in event.reason
    assert bookings_repair() == 0  # nothing left to do
    assert check_repaired() == []

    # Then the spare is cordoned too: no two nodes of one fabric are left, so it is at risk.
    operate(operator_client, "nodes/cordon", {"nodeId": spare, "reason": "fan"})
    assert bookings_repair() == 1
    assert nodes_of(gang["id"]) == moved  # not moved
    risk = get(offered_client, "beta", gang["id"])["atRisk"]
    spare_host = Node.objects.get(pk=spare).hostname
    assert risk["reason"].startswith(f"node {spare_host} is cordoned: fan; no other placement fits: "), risk
    assert "'fabric'" in risk["reason"]
    assert abs(risk["since"] - int(compute_now().timestamp() * 1000)) < 60_000
    status, listed = post_json(offered_client, "reservations/list", {"tenantId": "beta", "poolId": pool.id})
    assert status == 200 and listed["reservations"][0]["atRisk"] == risk
    assert at_risk_count(offered_client, "beta", pool) == 1
    assert at_risk_count(operator_client, "acme", pool) == 1  # the owner sees the pool's count too
    assert quota_used(pool, offered_tenant) == quota
    assert_rollups_equal_a_rebuild(pool)
    assert check_repaired() == []
    # Retried on every run, but the mark is set once: same since, no new event while nothing changed.
    assert bookings_repair() == 0
    assert get(offered_client, "beta", gang["id"])["atRisk"] == risk
    assert AuditEvent.objects.filter(action="reservation.at-risk", subject_id=gang["id"]).count() == 1

    # Capacity comes back on the fabric (the first node is uncordoned): the next run moves it, unmarked.
    operate(operator_client, "nodes/uncordon", {"nodeId": first[0]})
    assert bookings_repair() == 1
    assert nodes_of(gang["id"]) == sorted([first[0], first[1]])
    assert get(offered_client, "beta", gang["id"])["atRisk"] is None
    assert at_risk_count(offered_client, "beta", pool) == 0
    assert quota_used(pool, offered_tenant) == quota
    assert_rollups_equal_a_rebuild(pool)
    assert (held(spare, gang["id"]), held(first[0], gang["id"])) == (0, 8)
    repaired = AuditEvent.objects.filter(action="reservation.repaired", subject_id=gang["id"]).order_by("id")
    assert [e.data["atRiskCleared"] for e in repaired] == [False, True]
    assert check_no_double_booking() == [] and check_scalars() == [] and check_quota() == []
    assert check_repaired() == []


@pytest.mark.django_db(transaction=True)
def test_a_running_reservation_on_a_gpu_that_turns_unhealthy_is_at_risk_until_the_gpu_is_healthy_again(
    owned_pool: Pool, owner_client: APIClient, operator_client: APIClient
) -> None:
    make_node(owned_pool, hostname="run-0")
    make_node(owned_pool, hostname="run-1")
    rollup_rebuild(pool_id=owned_pool.id)
    running = create(owner_client, reservation_body(owned_pool, "acme", "running", gpus=1))
    assert running["state"] == "active"
    (uid,) = running["allocations"][0]["atoms"]
    before = nodes_of(running["id"])
    operate(operator_client, "devices/setHealth", {"deviceUid": uid, "healthy": False, "reason": "XID 79"})
    assert bookings_repair() == 1
    assert nodes_of(running["id"]) == before  # a running reservation never moves
    risk = get(owner_client, "acme", running["id"])["atRisk"]
    assert risk["reason"] == f"GPU {uid} is unhealthy; it is running and cannot move"
    assert at_risk_count(owner_client, "acme", owned_pool) == 1
    # The operators' CLI says so under the pool's rows.
    printed = run_command("capacity", "--tenant", "acme", "--pool", owned_pool.id)
    assert "1 reservation is at risk in this pool" in printed
    assert_rollups_equal_a_rebuild(owned_pool)
    assert check_repaired() == []
    event = AuditEvent.objects.get(action="reservation.at-risk", subject_id=running["id"])
    assert event.actor == "booking-repair" and event.reason == risk["reason"]
    # Marked, running and still on the bad GPU: nothing a sweep could change, so it is not read again.
    assert running["id"] not in repair_candidates(after="", limit=100)

    operate(operator_client, "devices/setHealth", {"deviceUid": uid, "healthy": True})
    assert running["id"] in repair_candidates(after="", limit=100)
    assert bookings_repair() == 1
    assert get(owner_client, "acme", running["id"])["atRisk"] is None
    assert at_risk_count(owner_client, "acme", owned_pool) == 0
    cleared = AuditEvent.objects.get(action="reservation.at-risk.cleared", subject_id=running["id"])
    assert cleared.data["previousReason"] == risk["reason"]
    assert check_repaired() == []


@pytest.mark.django_db(transaction=True)
def test_a_whole_node_lease_is_not_moved_but_marked_at_risk(
    owned_pool: Pool, owner_client: APIClient, operator_client: APIClient
) -> None:
    nodes = [make_node(owned_pool, hostname=f"whole-{i}", gpus=2, node_atom=True) for i in range(2)]
    rollup_rebuild(pool_id=owned_pool.id)
    whole_node = [{"class": "node", "count": 1}]
    body = reservation_body(
        owned_pool, "acme", "whole", devices=whole_node, binding="node", start=later_ms(1)
    )
    lease = create(owner_client, body)
    (node_id,) = nodes_of(lease["id"])
    assert node_id in {n.pk for n in nodes}
    operate(operator_client, "nodes/setMaintenance", {"nodeId": node_id, "on": True, "reason": "BIOS"})
    assert bookings_repair() == 1
    assert nodes_of(lease["id"]) == [node_id]
    reason = get(owner_client, "acme", lease["id"])["atRisk"]["reason"]
    assert reason.endswith("is in maintenance: BIOS; a whole-node lease is not moved"), reason
    assert_rollups_equal_a_rebuild(owned_pool)

    # Released, it is not at risk of anything: the next run clears the mark.
    status, _ = post_json(
        owner_client, "reservations/release", {"tenantId": "acme", "reservationId": lease["id"]}
    )
    assert status == 200
    assert get(owner_client, "acme", lease["id"])["atRisk"] is None
    assert bookings_repair() == 1
    assert Reservation.objects.get(pk=lease["id"]).at_risk_since is None
    assert check_repaired() == []


@pytest.mark.django_db(transaction=True)
def test_two_workers_repairing_at_once_move_each_reservation_once(
    owned_pool: Pool, owner_client: APIClient, operator_client: APIClient
) -> None:
    crowded = make_node(owned_pool, hostname="crowded", resources={"vcpu": 64})
    for i in range(3):
        make_node(owned_pool, hostname=f"roomy-{i}", resources={"vcpu": 64})
    rollup_rebuild(pool_id=owned_pool.id)
    # Eight future one-GPU reservations, all on the crowded node (the others are cordoned meanwhile).
    others = Node.objects.filter(pool=owned_pool).exclude(pk=crowded.pk)
    for node in others:
        operate(operator_client, "nodes/cordon", {"nodeId": node.pk, "reason": "not yet"})
    ids = [
        create(
            owner_client,
            reservation_body(
                owned_pool, "acme", f"crowd-{i}", gpus=1, resources={"vcpu": 4}, start=later_ms(1)
            ),
        )["id"]
        for i in range(8)
    ]
    assert all(nodes_of(rid) == [crowded.pk] for rid in ids)
    for node in others:
        operate(operator_client, "nodes/uncordon", {"nodeId": node.pk})
    operate(operator_client, "nodes/cordon", {"nodeId": crowded.pk, "reason": "drain"})

    workers = workers_race([bookings_repair, bookings_repair])
    for worker in workers:
        assert worker.error is None, worker.error
    assert sum(worker.result for worker in workers) == len(ids)
    repaired = Counter(
        AuditEvent.objects.filter(action="reservation.repaired").values_list("subject_id", flat=True)
    )
    assert repaired == Counter(dict.fromkeys(ids, 1))
    assert all(crowded.pk not in nodes_of(rid) for rid in ids)
    assert not DeviceBooking.objects.filter(device__node=crowded).exists()
    assert check_no_double_booking() == [] and check_scalars() == [] and check_quota() == []
    assert_rollups_equal_a_rebuild(owned_pool)
    assert check_repaired() == []
    assert all(held(crowded.pk, rid) == 0 for rid in ids)
    assert all(sum(held(node_id, rid) for node_id in nodes_of(rid)) == 1 for rid in ids)


@pytest.mark.django_db
def test_the_admin_node_and_pool_pages_list_the_at_risk_reservations(
    operator: Any, owned_pool: Pool, owner_client: APIClient
) -> None:
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    from operations.services import device_set_health

    node = make_node(owned_pool, hostname="admin-risk")
    running = create(owner_client, reservation_body(owned_pool, "acme", "admin-risk", gpus=1))
    (uid,) = running["allocations"][0]["atoms"]
    pool_url = reverse("admin:inventory_pool_change", args=[quote(owned_pool.pk)])
    assert "No reservation of this pool is at risk." in operator.get(pool_url).content.decode()
    device_set_health(device=Device.objects.get(uid=uid), healthy=False, reason="XID 48", actor="operator")
    assert bookings_repair() == 1
    reason = f"GPU {uid} is unhealthy; it is running and cannot move"

    pool_page = operator.get(pool_url).content.decode()
    assert '<span id="at-risk-count">1</span>' in pool_page
    assert running["id"] in pool_page and reason in pool_page
    node_page = operator.get(reverse("admin:inventory_node_change", args=[quote(node.pk)])).content.decode()
    assert 'id="node-at-risk"' in node_page and running["id"] in node_page and reason in node_page
    # The pool page links the reservation's own page, which shows the mark as well.
    link = reverse("admin:reservations_reservation_change", args=[quote(running["id"])])
    assert f'href="{link}"' in pool_page
    reservation_page = operator.get(link)
    assert reservation_page.status_code == 200 and reason in reservation_page.content.decode()


@pytest.mark.django_db
def test_the_schema_documents_at_risk_and_the_pools_count() -> None:
    import json

    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    components = schema["components"]["schemas"]

    def response_schema(path: str) -> dict[str, Any]:
        ref = schema["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"][
            "$ref"
        ]
        return components[ref.rsplit("/", 1)[-1]]

    reservation = response_schema("/api/compute/reservations/get")
    at_risk = reservation["properties"]["atRisk"]
    target = next(
        ref["$ref"] for ref in at_risk.get("allOf", at_risk.get("oneOf", [at_risk])) if "$ref" in ref
    )
    assert set(components[target.rsplit("/", 1)[-1]]["properties"]) == {"reason", "since"}
    by_pool = response_schema("/api/compute/capacity/byPool")
    assert by_pool["properties"]["atRiskReservations"]["type"] == "integer"
    assert "atRiskReservations" in by_pool["required"]


@pytest.mark.django_db(transaction=True)
def test_a_pass_after_which_nothing_was_given_back_tries_no_at_risk_move_and_a_release_makes_it_try(
    owner_client: APIClient, owner_tenant: Tenant, owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two 8-GPU nodes, one cordoned under a future 8-GPU booking while the other is taken: at risk.

    Passes that follow try nothing (no placement attempt) until capacity is given back in the
    pool; then the next pass moves it onto the freed node.
    """
    from reservations.lifecycle import repair

    first, second = make_node(owned_pool, hostname="a-0"), make_node(owned_pool, hostname="a-1")
    rollup_rebuild(pool_id=owned_pool.id)
    later = create(owner_client, reservation_body(owned_pool, "acme", "later", gpus=8, start=later_ms(2)))
    (node,) = nodes_of(later["id"])
    other = second.pk if node == first.pk else first.pk
    blocker = create(owner_client, reservation_body(owned_pool, "acme", "blocker", gpus=8, duration="4h"))
    assert nodes_of(blocker["id"]) == [other]
    node_cordon(node=Node.objects.get(pk=node), reason="xid 79", actor="test")
    bookings_repair()
    assert get(owner_client, "acme", later["id"])["atRisk"] is not None

    attempts: list[str] = []
    place = repair._place

    def counted(**kwargs: Any) -> Any:
        attempts.append(kwargs["reservation"].pk)
        return place(**kwargs)

    monkeypatch.setattr(repair, "_place", counted)
    assert bookings_repair() == 0 and bookings_repair() == 0
    assert attempts == []  # nothing was given back: nothing tried
    operate(owner_client, "reservations/release", {"tenantId": "acme", "reservationId": blocker["id"]})
    assert bookings_repair() == 1
    assert attempts == [later["id"]]
    moved = get(owner_client, "acme", later["id"])
    assert moved["atRisk"] is None and [a["nodeId"] for a in moved["allocations"]] == [other]


@pytest.mark.django_db(transaction=True)
def test_retried_moves_beyond_the_runs_budget_wait_for_the_next_run_which_is_asked_for(
    owner_client: APIClient, owner_tenant: Tenant, owned_pool: Pool
) -> None:
    from core.constants import WORKER_CHANNEL
    from tests.support.notifications import listening

    first, second = make_node(owned_pool, hostname="b-0"), make_node(owned_pool, hostname="b-1")
    rollup_rebuild(pool_id=owned_pool.id)
    later = create(owner_client, reservation_body(owned_pool, "acme", "later", gpus=8, start=later_ms(2)))
    (node,) = nodes_of(later["id"])
    other = second.pk if node == first.pk else first.pk
    blocker = create(owner_client, reservation_body(owned_pool, "acme", "blocker", gpus=8, duration="4h"))
    node_cordon(node=Node.objects.get(pk=node), reason="xid 79", actor="test")
    bookings_repair()
    operate(owner_client, "reservations/release", {"tenantId": "acme", "reservationId": blocker["id"]})
    with listening(WORKER_CHANNEL) as worker:
        # No time for retries in this run: nothing moves, and the worker is asked to run again later.
        assert bookings_repair(retry_seconds=0) == 0
        assert worker.next() == "repair-later"
    assert get(owner_client, "acme", later["id"])["atRisk"] is not None
    assert bookings_repair() == 1
    assert [a["nodeId"] for a in get(owner_client, "acme", later["id"])["allocations"]] == [other]
