"""The node agent's methods over HTTP: register, heartbeat, the assignment long poll and its answers.

A node registered by its agent is told of its assignments through
`nodes/assignments` (never through the stand-in daemon), and its answer to an
"assign" is guard 6: a refusal releases the reservation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import close_old_connections, connection
from rest_framework.test import APIClient

from core.models import Tenant
from core.services import token_issue
from inventory.models import Node, Pool
from reservations.models import NodeChange, Reservation
from tests.support.api import assert_error, bearer_client, post_json
from tests.support.factories import PoolFactory
from tests.support.reports import gpu, report

# The delivery runs after the create's commit: the tests commit.
pytestmark = pytest.mark.django_db(transaction=True)


def agent_for(pool: Pool) -> APIClient:
    return bearer_client(token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk)[1])


def registered(client: APIClient, pool: Pool, hostname: str = "gpu-x-001") -> str:
    status, body = post_json(client, "nodes/register", {"poolId": pool.pk, "hostname": hostname})
    assert status in (200, 201), body
    node_id: str = body["nodeId"]
    return node_id


def reported(client: APIClient, node_id: str, hostname: str = "gpu-x-001", gpus: int = 2) -> None:
    body = {"nodeId": node_id, "report": report(hostname, [gpu(i) for i in range(gpus)])}
    status, answer = post_json(client, "inventory/report", body)
    assert status == 200, answer


def body_for(pool: Pool, key: str, count: int = 1) -> dict[str, Any]:
    return {
        "tenantId": pool.owner_id,
        "poolId": pool.pk,
        "devices": [{"class": "gpu", "count": count}],
        "duration": 3600,
        "idempotencyKey": key,
    }


def create(client: APIClient, pool: Pool, key: str, count: int = 1) -> dict[str, Any]:
    status, answer = post_json(client, "reservations/create", body_for(pool, key, count))
    assert status == 201, answer
    return answer


def changes(client: APIClient, node_id: str, after: int = 0, wait_ms: int = 0) -> list[dict[str, Any]]:
    status, body = post_json(
        client, "nodes/assignments", {"nodeId": node_id, "after": after, "waitMs": wait_ms}
    )
    assert status == 200, body
    found: list[dict[str, Any]] = body["changes"]
    return found


@pytest.fixture
def pool(owner_tenant: Tenant) -> Pool:
    return PoolFactory(owner=owner_tenant)


def test_a_host_registers_once_and_joins_when_it_first_reports(pool: Pool) -> None:
    client = agent_for(pool)
    status, first = post_json(client, "nodes/register", {"poolId": pool.pk, "hostname": "gpu-x-001"})
    assert status == 201 and first["created"] is True
    status, again = post_json(client, "nodes/register", {"poolId": pool.pk, "hostname": "gpu-x-001"})
    assert status == 200 and again == {**first, "created": False}
    assert first["assignmentsUrl"] == ""  # no agents process configured: this service's own URL
    node = Node.objects.get(pk=first["nodeId"])
    assert node.agent and node.provision_state == "discovered"
    reported(client, node.pk)
    node.refresh_from_db()
    assert node.provision_state == "deployed" and node.connectivity == "connected"


def test_registering_is_decided_on_the_pool_and_a_hostname_belongs_to_one_pool(
    pool: Pool, owner_tenant: Tenant
) -> None:
    other = PoolFactory(owner=owner_tenant)
    client = agent_for(pool)
    status, body = post_json(client, "nodes/register", {"poolId": other.pk, "hostname": "gpu-x-001"})
    assert_error(status, body, "PERMISSION_DENIED", 403)
    registered(client, pool)
    status, body = post_json(
        agent_for(other), "nodes/register", {"poolId": other.pk, "hostname": "gpu-x-001"}
    )
    assert_error(status, body, "CONFLICT", 409)


def test_a_heartbeat_is_proof_of_life_until_the_node_is_disconnected(pool: Pool) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    Node.objects.filter(pk=node_id).update(last_heartbeat_at=None)
    status, body = post_json(client, "nodes/heartbeat", {"nodeId": node_id})
    assert (status, body) == (200, {"nodeId": node_id, "connected": True})
    assert Node.objects.get(pk=node_id).last_heartbeat_at is not None
    Node.objects.filter(pk=node_id).update(connectivity="disconnected")
    status, body = post_json(client, "nodes/heartbeat", {"nodeId": node_id})
    assert body["connected"] is False


def test_an_answered_poll_is_a_heartbeat(pool: Pool) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    Node.objects.filter(pk=node_id).update(last_heartbeat_at=None)
    status, body = post_json(client, "nodes/assignments", {"nodeId": node_id})
    assert (status, body["connected"]) == (200, True)
    assert Node.objects.get(pk=node_id).last_heartbeat_at is not None
    Node.objects.filter(pk=node_id).update(connectivity="disconnected")
    status, body = post_json(client, "nodes/assignments", {"nodeId": node_id, "waitMs": 5000})
    assert (status, body) == (200, {"nodeId": node_id, "connected": False, "changes": []})


def test_an_agents_node_hears_of_its_assignments_through_the_long_poll(
    pool: Pool, owner_client: APIClient
) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    made = create(owner_client, pool, "agent-1", count=2)
    (assign,) = changes(client, node_id)
    assert assign["kind"] == "assign" and assign["reservationId"] == made["id"]
    assert sorted(assign["atoms"]) == sorted(made["allocations"][0]["atoms"])
    assert assign["start"] == made["start"] and assign["end"] == made["end"]
    with connection.cursor() as cursor:  # the stand-in daemon was never told
        cursor.execute("SELECT count(*) FROM fake_daemon_assignments WHERE node_id = %s", [node_id])
        assert cursor.fetchone() == (0,)
    status, answer = post_json(
        client, "nodes/ack", {"nodeId": node_id, "deliveryId": assign["deliveryId"], "accepted": True}
    )
    assert (status, answer["accepted"]) == (200, True)
    status, _ = post_json(
        owner_client, "reservations/release", {"tenantId": pool.owner_id, "reservationId": made["id"]}
    )
    (shorten,) = changes(client, node_id, after=assign["deliveryId"])
    assert shorten["kind"] == "shorten" and shorten["end"] <= made["end"]


def test_a_refused_assignment_releases_the_reservation(pool: Pool, owner_client: APIClient) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    made = create(owner_client, pool, "agent-2")
    (assign,) = changes(client, node_id)
    refusal = {
        "nodeId": node_id,
        "deliveryId": assign["deliveryId"],
        "accepted": False,
        "reason": "atom held",
    }
    status, answer = post_json(client, "nodes/ack", refusal)
    assert (status, answer["accepted"], answer["reason"]) == (200, False, "atom held")
    assert Reservation.objects.get(pk=made["id"]).state == "released"
    # The first answer stands.
    status, again = post_json(client, "nodes/ack", {**refusal, "accepted": True, "reason": ""})
    assert again["accepted"] is False
    assert NodeChange.objects.get(pk=assign["deliveryId"]).accepted is False


def test_a_holder_cut_since_it_was_told_hears_of_it_before_the_next_assign(
    pool: Pool, owner_client: APIClient
) -> None:
    """The release's own shorten not written yet (its delivery is late): the next assign writes it first."""
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id, gpus=1)
    first = create(owner_client, pool, "agent-5")
    post_json(owner_client, "reservations/release", {"tenantId": pool.owner_id, "reservationId": first["id"]})
    NodeChange.objects.filter(reservation_id=first["id"], kind="shorten").delete()
    second = create(owner_client, pool, "agent-6")
    told = [(c["kind"], c["reservationId"]) for c in changes(client, node_id)]
    assert told == [("assign", first["id"]), ("shorten", first["id"]), ("assign", second["id"])]


def test_another_nodes_change_is_not_found(pool: Pool, owner_client: APIClient) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    other = registered(client, pool, "gpu-x-002")
    reported(client, node_id)
    create(owner_client, pool, "agent-3")
    (assign,) = changes(client, node_id)
    status, body = post_json(
        client, "nodes/ack", {"nodeId": other, "deliveryId": assign["deliveryId"], "accepted": True}
    )
    assert_error(status, body, "NOT_FOUND", 404)


def test_a_waiting_long_poll_answers_when_a_change_commits(owner_tenant: Tenant) -> None:
    pool = PoolFactory(owner=owner_tenant)
    client = agent_for(pool)
    owner = bearer_client(token_issue(tenant_id=owner_tenant.pk, role="member")[1])
    node_id = registered(client, pool)
    reported(client, node_id)
    created: list[dict[str, Any]] = []

    def create_soon() -> None:
        time.sleep(0.5)
        try:
            created.append(create(owner, pool, "agent-4"))
        finally:
            close_old_connections()

    thread = threading.Thread(target=create_soon)
    started = time.monotonic()
    thread.start()
    found = changes(client, node_id, wait_ms=10_000)
    waited = time.monotonic() - started
    thread.join()
    assert [change["reservationId"] for change in found] == [created[0]["id"]]
    assert 0.4 < waited < 9
    started = time.monotonic()
    assert changes(client, node_id, after=found[0]["deliveryId"], wait_ms=300) == []
    assert time.monotonic() - started >= 0.3


# --- What the node gave the workload (`placement`), and what a spot workload is told ------

PLACEMENT = {"cpus": [3, 1, 2, 0, 8], "numaNodes": [0], "gpuLocal": True}


def allocation_placement(client: APIClient, pool: Pool, reservation_id: str) -> Any:
    body = {"tenantId": pool.owner_id, "reservationId": reservation_id}
    status, answer = post_json(client, "reservations/get", body)
    assert status == 200, answer
    (allocation,) = answer["allocations"]
    return allocation["placement"]


def test_an_accepted_assign_keeps_the_placement_and_reservations_get_shows_it(
    pool: Pool, owner_client: APIClient
) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    made = create(owner_client, pool, "agent-p1")
    assert made["allocations"][0]["placement"] is None
    assert allocation_placement(owner_client, pool, made["id"]) is None
    (assign,) = changes(client, node_id)
    ack = {"nodeId": node_id, "deliveryId": assign["deliveryId"], "accepted": True, "placement": PLACEMENT}
    status, answer = post_json(client, "nodes/ack", ack)
    assert (status, answer["accepted"]) == (200, True)
    shown = {"cpus": [0, 1, 2, 3, 8], "numaNodes": [0], "gpuLocal": True}
    assert allocation_placement(owner_client, pool, made["id"]) == shown
    # The first answer stands: answering again with another placement changes nothing.
    other = {"cpus": [100], "numaNodes": [1], "gpuLocal": False}
    status, _ = post_json(client, "nodes/ack", {**ack, "placement": other})
    assert status == 200
    assert allocation_placement(owner_client, pool, made["id"]) == shown
    # A shorten's answer carries none; one given is ignored.
    post_json(owner_client, "reservations/release", {"tenantId": pool.owner_id, "reservationId": made["id"]})
    (shorten,) = changes(client, node_id, after=assign["deliveryId"])
    ack = {"nodeId": node_id, "deliveryId": shorten["deliveryId"], "accepted": True, "placement": other}
    status, _ = post_json(client, "nodes/ack", ack)
    assert status == 200
    assert allocation_placement(owner_client, pool, made["id"]) == shown


@pytest.mark.parametrize(
    ("placement", "accepted", "field"),
    [
        ({**PLACEMENT, "memory": 1}, True, "placement.memory"),
        ({**PLACEMENT, "cpus": [0, 1, 1]}, True, "placement.cpus"),
        ({**PLACEMENT, "numaNodes": [0, 0]}, True, "placement.numaNodes"),
        ({**PLACEMENT, "cpus": [0, -1]}, True, "placement.cpus[1]"),
        ({**PLACEMENT, "cpus": "0-3"}, True, "placement.cpus"),
        ({**PLACEMENT, "gpuLocal": "yes"}, True, "placement.gpuLocal"),
        ({"cpus": [0]}, True, "placement.numaNodes"),
        ("0-3", True, "placement"),
        (PLACEMENT, False, "placement"),
    ],
)
def test_a_placement_of_another_shape_is_refused_and_changes_nothing(
    pool: Pool, owner_client: APIClient, placement: Any, accepted: bool, field: str
) -> None:
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id)
    made = create(owner_client, pool, "agent-p2")
    (assign,) = changes(client, node_id)
    ack = {
        "nodeId": node_id,
        "deliveryId": assign["deliveryId"],
        "accepted": accepted,
        "placement": placement,
    }
    status, body = post_json(client, "nodes/ack", ack)
    assert_error(status, body, "INVALID_INPUT", 400)
    assert field in [detail["field"] for detail in body["error"]["details"]]
    assert NodeChange.objects.get(pk=assign["deliveryId"]).answered_at is None
    assert Reservation.objects.get(pk=made["id"]).state == "active"
    assert allocation_placement(owner_client, pool, made["id"]) is None


def test_a_change_says_whether_the_reservation_is_spot_and_carries_its_notice(
    pool: Pool, owner_client: APIClient
) -> None:
    Pool.objects.filter(pk=pool.pk).update(notice_seconds=600)
    client = agent_for(pool)
    node_id = registered(client, pool)
    reported(client, node_id, gpus=1)
    spot = post_json(owner_client, "reservations/create", {**body_for(pool, "agent-s1"), "spot": True})[1]
    (assign,) = changes(client, node_id)
    assert (assign["reservationId"], assign["spot"]) == (spot["id"], True) and "notice" not in assign
    # A regular reservation displaces the spot one: the spot's shorten carries the notice.
    regular = create(owner_client, pool, "agent-s2")
    told = changes(client, node_id, after=assign["deliveryId"])
    assert [(c["kind"], c["reservationId"]) for c in told] == [
        ("shorten", spot["id"]),
        ("assign", regular["id"]),
    ]
    shorten, regular_assign = told
    status, got = post_json(
        owner_client, "reservations/get", {"tenantId": pool.owner_id, "reservationId": spot["id"]}
    )
    assert status == 200, got
    assert shorten["notice"] == {"givenAt": got["notice"]["at"], "endsAt": got["notice"]["endsAt"]}
    assert shorten["end"] == got["notice"]["endsAt"] == got["end"]
    assert regular_assign["spot"] is False and "notice" not in regular_assign
