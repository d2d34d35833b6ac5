"""BookingRepair between its whole-fleet scans: it looks where a node change named, not at the fleet.

A node change that leaves booked atoms uncounted writes a `RepairRequest` per
node in its own transaction; the next run reads those nodes' bookings, and the
marked reservations through their own index, and deletes the requests it read.
What no change named (a row edited behind the services' back) waits for the
periodic scan of the whole fleet (`CAPACITY_REPAIR_FLEET_SCAN_SECONDS`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from inventory.models import Node, Pool
from reservations.lifecycle import repair_sweep
from reservations.lifecycle.repair_sweep import bookings_repair
from reservations.models import RepairRequest
from reservations.rollups.recount import rollup_rebuild
from tests.reservations.test_repair import create, get, later_ms, nodes_of, operate
from tests.support.api import reservation_body
from tests.support.placement import make_node


def one_node_booked(pool: Pool, client: APIClient, key: str) -> tuple[dict[str, Any], str]:
    """A lone 8-GPU node and a future reservation of all of it: nowhere to move, so a cordon marks it."""
    make_node(pool, hostname=f"{key}-0")
    rollup_rebuild(pool_id=pool.id)
    booked = create(client, reservation_body(pool, "acme", key, gpus=8, start=later_ms(2)))
    (node_id,) = nodes_of(booked["id"])
    return booked, node_id


def requested_nodes() -> list[str]:
    return sorted(RepairRequest.objects.values_list("node_id", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_cordon_names_its_node_and_the_next_run_marks_its_reservation_and_deletes_the_request(
    owned_pool: Pool, owner_client: APIClient, operator_client: APIClient
) -> None:
    booked, node_id = one_node_booked(owned_pool, owner_client, "named")
    assert requested_nodes() == []
    operate(operator_client, "nodes/cordon", {"nodeId": node_id, "reason": "PSU swap"})
    assert requested_nodes() == [node_id]

    assert bookings_repair() == 1
    risk = get(owner_client, "acme", booked["id"])["atRisk"]
    assert risk is not None and "is cordoned: PSU swap" in risk["reason"]
    assert requested_nodes() == []
    # The mark is re-read through the reservation's own bookings: an uncordon clears it.
    operate(operator_client, "nodes/uncordon", {"nodeId": node_id})
    assert bookings_repair() == 1
    assert get(owner_client, "acme", booked["id"])["atRisk"] is None


@pytest.mark.django_db(transaction=True)
def test_what_no_change_named_waits_for_the_whole_fleet_scan(
    owned_pool: Pool, owner_client: APIClient
) -> None:
    booked, node_id = one_node_booked(owned_pool, owner_client, "unnamed")
    # Edited behind the services' back: no rollup delta, no request.
    Node.objects.filter(pk=node_id).update(cordoned=True, cordon_reason="edited by hand")
    assert bookings_repair() == 0
    assert get(owner_client, "acme", booked["id"])["atRisk"] is None

    with override_settings(CAPACITY_REPAIR_FLEET_SCAN_SECONDS=0):
        assert bookings_repair() == 1
    assert "edited by hand" in get(owner_client, "acme", booked["id"])["atRisk"]["reason"]


@pytest.mark.django_db(transaction=True)
def test_a_request_committed_while_a_run_looks_is_left_for_the_next_run(
    owned_pool: Pool, owner_client: APIClient, operator_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    booked, node_id = one_node_booked(owned_pool, owner_client, "racing")
    original: Callable[..., list[tuple[str, bool]]] = repair_sweep._candidates

    def candidates_then_a_cordon(**kwargs: Any) -> list[tuple[str, bool]]:
        found = original(**kwargs)

        def cordon() -> None:
            try:
                operate(operator_client, "nodes/cordon", {"nodeId": node_id, "reason": "late"})
            finally:
                connection.close()

        racer = threading.Thread(target=cordon)
        racer.start()
        racer.join()
        return found

    monkeypatch.setattr(repair_sweep, "_candidates", candidates_then_a_cordon)
    assert bookings_repair() == 0  # it looked before the cordon committed
    monkeypatch.undo()
    assert requested_nodes() == [node_id]
    assert bookings_repair() == 1
    assert "late" in get(owner_client, "acme", booked["id"])["atRisk"]["reason"]
    assert requested_nodes() == []
