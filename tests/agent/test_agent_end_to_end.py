"""The node agent end to end: real `better-compute-agent run` processes against a live server.

Each agent reads a shipped host snapshot (or a copy made a second host of its
kind), registers in its pool with a pool-scoped node-agent token, reports,
heartbeats every second and long-polls its assignments, keeping its store and
CDI spec in the test's own directory. What the scenarios check is what an
operator and a tenant see: the pool's rows in `capacity/byPool`, the CDI device
a container asks for, a dead host's future bookings moved, a forced double
booking refused by the node itself, and a MIG re-layout refused while booked.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.clock import compute_now
from core.models import AuditEvent, Tenant
from inventory.models import Device, Node, Pool
from reservations.models import Allocation, NodeChange, Reservation
from reservations.nodes.liveness import nodes_mark_stale
from tests.support.agents import (
    A100_MIG,
    H100,
    L40S,
    AgentProcess,
    Agents,
    host_snapshot,
    visible_devices,
    wait_for,
    write_snapshot,
)
from tests.support.api import post_json
from tests.support.commands import run_command
from tests.support.factories import PoolFactory

# The agents reach the database through the live server: everything commits.
pytestmark = pytest.mark.django_db(transaction=True)

# How long a node's agent may take to register and report, and the CDI promise of the README.
JOIN_SECONDS = 15.0
CDI_SECONDS = 2.0


@pytest.fixture
def agents(live_server: Any, tmp_path: Path) -> Iterator[Agents]:
    running = Agents(url=live_server.url, root=tmp_path)
    try:
        yield running
    finally:
        running.close()


def rows(client: APIClient, pool: Pool) -> dict[str, dict[str, Any]]:
    """The pool's `capacity/byPool` rows, by resource."""
    status, body = post_json(client, "capacity/byPool", {"tenantId": pool.owner_id, "poolId": pool.pk})
    assert status == 200, body
    return {row["resource"]: row for row in body["rows"]}


def joined(client: APIClient, pool: Pool, agent: AgentProcess, resource: str, count: int) -> str:
    """Wait until the agent's node is in the pool with `count` allocatable `resource`; its node id."""
    node_id = agent.node_id(seconds=JOIN_SECONDS)
    wait_for(
        lambda: rows(client, pool).get(resource, {}).get("allocatable") == count,
        seconds=JOIN_SECONDS,
        what=lambda: f"{count} {resource} allocatable in {pool.name}\n{agent.log()}",
    )
    return node_id


def create(client: APIClient, pool: Pool, key: str, devices: list[dict[str, Any]], **extra: Any) -> Any:
    body = {
        "tenantId": pool.owner_id,
        "poolId": pool.pk,
        "devices": devices,
        "duration": "1h",
        "idempotencyKey": key,
        **extra,
    }
    status, answer = post_json(client, "reservations/create", body)
    assert status == 201, answer
    return answer


def release(client: APIClient, pool: Pool, reservation_id: str) -> None:
    body = {"tenantId": pool.owner_id, "reservationId": reservation_id}
    status, answer = post_json(client, "reservations/release", body)
    assert status == 200, answer


def answered(reservation_id: str, *, kind: str = "assign", **where: Any) -> NodeChange:
    """The (first) change of `kind` of the reservation, once its node has answered it."""
    changes = NodeChange.objects.filter(reservation_id=reservation_id, kind=kind, **where).order_by("id")
    return wait_for(
        lambda: changes.filter(answered_at__isnull=False).first(),
        seconds=5,
        what=f"the node answered the {kind} of {reservation_id}",
    )


def test_three_hosts_join_their_pools_with_the_atoms_their_snapshots_show(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient
) -> None:
    h100 = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="H100")
    a100 = PoolFactory(owner=owner_tenant, sharing="mig", gpu_model="A100")
    l40s = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="L40S")
    hosts = [
        (h100, agents.start(h100, H100), "gpu-h100-001", "gpu", 8),
        (a100, agents.start(a100, A100_MIG), "gpu-a100-mig-001", "gpu.mig", 8 * 7),
        (l40s, agents.start(l40s, L40S), "gpu-l40s-001", "gpu", 4),
    ]
    for pool, agent, hostname, resource, count in hosts:
        node_id = joined(owner_client, pool, agent, resource, count)
        node = Node.objects.get(pk=node_id)
        assert (node.hostname, node.pool_id, node.agent) == (hostname, pool.pk, True)
        assert (node.provision_state, node.connectivity) == ("deployed", "connected")
        row = rows(owner_client, pool)[resource]
        assert (row["total"], row["allocatable"], row["allocated"], row["reserved"]) == (count, count, 0, 0)
    # A MIG GPU is never booked whole: its instances are the atoms.
    assert rows(owner_client, a100)["gpu"]["total"] == 0
    assert all("gpu.mig" not in rows(owner_client, pool) for pool in (h100, l40s))


def test_a_reservations_gpus_are_in_the_cdi_spec_from_its_start_until_its_release(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient
) -> None:
    pool = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="L40S")
    agent = agents.start(pool, L40S)
    joined(owner_client, pool, agent, "gpu", 4)
    assert agent.cdi_devices() == {}

    asked = time.monotonic()
    made = create(owner_client, pool, "cdi-1", [{"class": "gpu", "count": 2}])
    device = wait_for(
        lambda: agent.cdi_devices().get(made["id"]), seconds=5, what=f"{made['id']} in the CDI spec"
    )
    took = time.monotonic() - asked
    assert took < CDI_SECONDS, f"the CDI device came {took:.2f} s after the create"
    (allocation,) = made["allocations"]
    booked = sorted(atom for atom in allocation["atoms"] if atom.startswith("GPU-"))
    assert len(booked) == 2
    assert sorted(visible_devices(device)) == booked
    assert len(device["containerEdits"]["deviceNodes"]) == 2  # one /dev/nvidiaN per GPU
    assert list(agent.cdi_devices()) == [made["id"]]
    assert answered(made["id"]).accepted is True

    asked = time.monotonic()
    release(owner_client, pool, made["id"])
    wait_for(
        lambda: made["id"] not in agent.cdi_devices(), seconds=5, what=f"{made['id']} out of the CDI spec"
    )
    took = time.monotonic() - asked
    assert took < CDI_SECONDS, f"the CDI device stayed {took:.2f} s after the release"
    assert agent.cdi_devices() == {}


@dataclass
class Moved:
    """A future `hold` reservation booked on a host whose agent was then killed, and the two hosts."""

    pool: Pool
    reservation: dict[str, Any]
    victim_id: str
    victim: AgentProcess
    survivor_id: str
    survivor: AgentProcess


def booked_on_a_killed_host(
    agents: Agents, owner_tenant: Tenant, client: APIClient, settings: Any, directory: Path
) -> Moved:
    """Two H100 hosts; eight GPUs booked an hour ahead on one; its agent SIGKILLed; liveness run until
    the service sees it disconnected (the stale limit set to a few heartbeats)."""
    pool = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="H100")
    second = host_snapshot(H100, directory, hostname="gpu-h100-002")
    started = [agents.start(pool, H100), agents.start(pool, second)]
    by_node = {agent.node_id(seconds=JOIN_SECONDS): agent for agent in started}
    joined(client, pool, started[0], "gpu", 16)

    start = int((compute_now() + timedelta(hours=1)).timestamp() * 1000)
    made = create(client, pool, "hold-1", [{"class": "gpu", "count": 8}], start=start, binding="hold")
    assert made["state"] == "scheduled"
    (allocation,) = made["allocations"]
    victim_id = allocation["nodeId"]
    (survivor_id,) = set(by_node) - {victim_id}
    moved = Moved(pool, made, victim_id, by_node[victim_id], survivor_id, by_node[survivor_id])
    wait_for(lambda: made["id"] in moved.victim.holdings(), seconds=5, what="the first host holds it")

    assert moved.victim.stop(signal.SIGKILL) == -signal.SIGKILL
    settings.CAPACITY_NODE_STALE_SECONDS = 3
    wait_for(
        lambda: nodes_mark_stale() and Node.objects.get(pk=victim_id).connectivity == "disconnected",
        seconds=15,
        what="liveness disconnected the killed host",
    )
    assert Node.objects.get(pk=survivor_id).connectivity == "connected"
    return moved


def test_a_killed_hosts_future_hold_booking_moves_to_another_host(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient, settings: Any, tmp_path: Path
) -> None:
    moved = booked_on_a_killed_host(agents, owner_tenant, owner_client, settings, tmp_path)
    made, pool = moved.reservation, moved.pool
    run_command("worker", "--once")  # liveness, then BookingRepair, then the outbox
    reservation = Reservation.objects.get(pk=made["id"])
    assert reservation.state == "scheduled" and reservation.at_risk_since is None
    nodes = Allocation.objects.filter(reservation=reservation).values_list("node_id", flat=True)
    assert list(nodes) == [moved.survivor_id]
    event = AuditEvent.objects.get(action="reservation.repaired", subject_id=made["id"])
    assert (event.data["fromNodes"], event.data["toNodes"]) == ([moved.victim_id], [moved.survivor_id])
    status, got = post_json(
        owner_client, "reservations/get", {"tenantId": pool.owner_id, "reservationId": made["id"]}
    )
    assert status == 200, got
    assert (got["start"], got["end"], got["state"]) == (made["start"], made["end"], "scheduled")
    (allocation,) = got["allocations"]
    assert allocation["nodeId"] == moved.survivor_id
    survivor_gpus = set(
        Device.objects.filter(node_id=moved.survivor_id, device_class="gpu").values_list("uid", flat=True)
    )
    assert {atom for atom in allocation["atoms"] if atom.startswith("GPU-")} == survivor_gpus
    assert rows(owner_client, pool)["gpu"]["unreachable"] == 8
    # The surviving host's agent hears of it, and holds it for the same window.
    holding = wait_for(
        lambda: moved.survivor.holdings().get(made["id"]), seconds=5, what="the second host holds it"
    )
    assert (holding.start_ms, holding.end_ms) == (made["start"], made["end"])
    assert survivor_gpus <= set(holding.atoms)
    assert answered(made["id"], node_id=moved.survivor_id).accepted is True


def test_a_killed_host_that_comes_back_drops_the_booking_that_moved_away(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient, settings: Any, tmp_path: Path
) -> None:
    moved = booked_on_a_killed_host(agents, owner_tenant, owner_client, settings, tmp_path)
    made = moved.reservation
    run_command("worker", "--once")
    assert Allocation.objects.get(reservation_id=made["id"]).node_id == moved.survivor_id
    moved.victim.start()
    wait_for(
        lambda: Node.objects.get(pk=moved.victim_id).connectivity == "connected",
        seconds=JOIN_SECONDS,
        what="the host reconnected",
    )
    # Else, at the reservation's start, the old host names its own GPUs for it in its CDI spec.
    wait_for(
        lambda: made["id"] not in moved.victim.holdings(),
        seconds=5,
        what=lambda: f"the old host dropped {made['id']}\n{moved.victim.log()}",
    )


def forget_behind_the_services_back(reservation_id: str) -> None:
    """Free the reservation's atoms in the database, and forget that its node was ever told of it.

    Its bookings go, and so do its node changes: with them the service would
    know the node may still hold it, and tell the node to drop it before the
    next assign on those atoms (`reservations.delivery.agent._cut_holders`).
    What is left is a node holding what the service has no record of, as after
    a restore of the database from before the reservation.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM device_bookings WHERE allocation_id IN"
            " (SELECT id FROM reservations_allocation WHERE reservation_id = %s)",
            [reservation_id],
        )
        assert cursor.rowcount > 0
        cursor.execute("DELETE FROM reservations_nodechange WHERE reservation_id = %s", [reservation_id])
        cursor.execute(
            "SELECT count(*) FROM reservations_delivery WHERE reservation_id = %s", [reservation_id]
        )
        assert cursor.fetchone() == (0,), "an outbox row would still tell the node"


def test_a_restarted_agent_refuses_an_assignment_that_overlaps_what_its_store_holds(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient
) -> None:
    pool = PoolFactory(owner=owner_tenant, sharing="exclusive", gpu_model="L40S")
    agent = agents.start(pool, L40S)
    node_id = joined(owner_client, pool, agent, "gpu", 4)
    first = create(owner_client, pool, "held-1", [{"class": "gpu", "count": 4}])
    assert answered(first["id"]).accepted is True
    wait_for(lambda: first["id"] in agent.cdi_devices(), seconds=5, what="the first is in the CDI spec")
    assert agent.stop(signal.SIGTERM) == 0

    forget_behind_the_services_back(first["id"])
    second = create(owner_client, pool, "held-2", [{"class": "gpu", "count": 4}])
    assert sorted(second["allocations"][0]["atoms"]) == sorted(first["allocations"][0]["atoms"])
    told = NodeChange.objects.filter(node_id=node_id).values_list("kind", "reservation_id")
    assert list(told) == [("assign", second["id"])]  # nothing tells the node to drop the first

    agent.start()
    refusal = answered(second["id"])
    assert refusal.accepted is False
    assert f"is held by {first['id']}" in refusal.reason, refusal.reason
    assert Reservation.objects.get(pk=second["id"]).state == "released"
    assert list(agent.holdings()) == [first["id"]]
    assert list(agent.cdi_devices()) == [first["id"]]
    assert f"refused {second['id']}" in agent.log()


def relayout(snapshot: Path, gpu_uuid: str, directory: Path) -> Path:
    """A copy of the snapshot whose GPU `gpu_uuid` is re-partitioned as one 7g.80gb instance."""
    data = json.loads(snapshot.read_text())
    (gpu,) = [gpu for gpu in data["gpus"] if gpu["uuid"] == gpu_uuid]
    first = gpu["mig"]["instances"][0]
    gpu["mig"]["instances"] = [
        {**first, "gi": 0, "ci": 0, "profile": "7g.80gb", "memoryMiB": 81152, "uuid": f"MIG-{gpu_uuid[4:]}"}
    ]
    path = directory / "relayout.json"
    write_snapshot(path, data)
    return path


def test_a_mig_layout_change_is_refused_while_an_instance_is_booked_and_taken_once_released(
    agents: Agents, owner_tenant: Tenant, owner_client: APIClient, tmp_path: Path
) -> None:
    pool = PoolFactory(owner=owner_tenant, sharing="mig", gpu_model="A100")
    agent = agents.start(pool, A100_MIG)
    node_id = joined(owner_client, pool, agent, "gpu.mig", 56)
    made = create(owner_client, pool, "mig-1", [{"class": "gpu.mig", "count": 1}])
    (atom,) = [atom for atom in made["allocations"][0]["atoms"] if "/gi" in atom]
    gpu_uuid = atom.split("/")[0]
    device = wait_for(lambda: agent.cdi_devices().get(made["id"]), seconds=5, what="the instance in CDI")
    (mig_uuid,) = visible_devices(device)
    assert mig_uuid.startswith("MIG-")
    assert agent.stop(signal.SIGTERM) == 0
    changed = relayout(agent.snapshot, gpu_uuid, tmp_path)

    refused = agent.once(snapshot=changed)
    assert refused.returncode == 1, refused
    assert "CONFLICT" in refused.stderr and gpu_uuid in refused.stderr, refused.stderr
    assert Device.objects.get(uid=atom).vanished_at is None  # nothing of the report was applied
    assert not Device.objects.filter(uid=f"{gpu_uuid}/gi0/ci0").exists()
    assert rows(owner_client, pool)["gpu.mig"]["total"] == 56

    release(owner_client, pool, made["id"])
    taken = agent.once(snapshot=changed)
    assert taken.returncode == 0, taken
    assert Device.objects.get(uid=atom).vanished_at is not None
    new = Device.objects.get(uid=f"{gpu_uuid}/gi0/ci0", node_id=node_id)
    assert new.attributes["migProfile"] == "7g.80gb" and new.vanished_at is None
    assert agent.cdi_devices() == {}  # the release reached the node with the report
    # Seven 1g.10gb instances became one 7g.80gb, booked for the layout change's window (guard 2).
    row = rows(owner_client, pool)["gpu.mig"]
    assert (row["total"], row["allocated"]) == (56 - 7 + 1, 1)
