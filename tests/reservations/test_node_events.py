"""Node events: a node or device change moves the node's atoms between the rollup counts at once.

Operators act over HTTP (`nodes/*`, `devices/setHealth`), liveness calls
`node_set_connectivity`; the numbers are read over HTTP (`capacity/byPool`) in
the same breath, and the rows must equal a rebuild's recount in whatever state
the fleet is left. (Node reports: `test_node_event_reports.py`; wake-ups and
races on real connections: `test_node_event_races.py`.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from core.clock import set_clock_offset
from core.models import AuditEvent
from inventory.models import Node, Pool
from operations import services as operator_actions
from reservations.nodes import changes as node_events
from reservations.nodes.changes import nodes_changing
from reservations.rollups.recount import rollup_rebuild
from tests.support.node_events import api, by_pool, connectivity, counts, health
from tests.support.placement import make_node
from tests.support.records import audit_trail, snapshot, snapshot_after_rebuild

# Each: (do it, undo it, what byPool shows in between). The node is `booked`.
OUT_OF_THE_COUNT = {
    "cordon": (
        api("nodes/cordon", reason="PSU swap"),
        api("nodes/uncordon"),
        {"gpu": counts(maintenance=4), "vcpu": counts(maintenance=64)},
    ),
    "maintenance": (
        api("nodes/setMaintenance", on=True, reason="firmware"),
        api("nodes/setMaintenance", on=False),
        {"gpu": counts(maintenance=4), "vcpu": counts(maintenance=64)},
    ),
    "noschedule-taint": (
        api("nodes/taint", key="gpu.example.com/xid", value="79", effect="NoSchedule", reason="xid"),
        api("nodes/untaint", key="gpu.example.com/xid"),
        {"gpu": counts(unhealthy=4), "vcpu": counts(unhealthy=64)},
    ),
    "disconnect": (
        connectivity(False),
        connectivity(True),
        {"gpu": counts(unreachable=4), "vcpu": counts(unreachable=64)},
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(OUT_OF_THE_COUNT))
def test_a_node_change_moves_its_atoms_and_scalars_between_the_counts_at_once(
    name: str, owner_client: APIClient, operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    do, undo, out = OUT_OF_THE_COUNT[name]
    counted = {
        "gpu": counts(allocatable=4, allocated=2, reserved=1),
        "vcpu": counts(allocatable=64, allocated=8),
    }
    assert by_pool(owner_client, owned_pool) == counted

    do(operator_client, booked)
    # No rebuild in between: the node's atoms left `allocatable`, and their bookings the counts.
    assert by_pool(owner_client, owned_pool) == out
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    undo(operator_client, booked)
    assert by_pool(owner_client, owned_pool) == counted
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_a_gpu_health_flip_moves_that_atom_and_its_booking(
    owner_client: APIClient, operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    device = booked.devices.order_by("uid").first()
    assert device is not None
    on_it = device.bookings.filter(phase__in=[0, 1]).count()

    health(False)(operator_client, booked)

    gpu = by_pool(owner_client, owned_pool)["gpu"]
    assert (gpu["allocatable"], gpu["unhealthy"]) == (3, 1)
    assert gpu["allocated"] + gpu["reserved"] == 3 - on_it
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    health(True)(operator_client, booked)
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(allocatable=4, allocated=2, reserved=1)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_changes_stack_and_a_repeated_change_moves_nothing(
    owner_client: APIClient, operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    api("nodes/cordon", reason="PSU swap")(operator_client, booked)
    api("nodes/cordon", reason="again")(operator_client, booked)
    connectivity(False)(operator_client, booked)  # still in maintenance: the first bucket that matches
    api("nodes/taint", key="k", effect="NoSchedule", reason="xid")(operator_client, booked)
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(maintenance=4)

    api("nodes/uncordon")(operator_client, booked)
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(unreachable=4)
    connectivity(True)(operator_client, booked)
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(unhealthy=4)
    api("nodes/untaint", key="k")(operator_client, booked)
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(allocatable=4, allocated=2, reserved=1)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_node_set_connectivity_is_a_guarded_audited_write(owned_pool: Pool) -> None:
    node = make_node(owned_pool, gpus=1)
    down = node_events.node_set_connectivity(node=node, connected=False, actor="liveness", reason="no report")
    again = node_events.node_set_connectivity(
        node=node, connected=False, actor="liveness", reason="no report"
    )
    assert down.connectivity == again.connectivity == "disconnected"
    assert node_events.node_set_connectivity(
        node=node, connected=True, actor="ops", reason=""
    ).connectivity == ("connected")
    assert audit_trail(node) == ["node.disconnected", "node.connected"]
    event = AuditEvent.objects.get(subject_id=node.pk, action="node.disconnected")
    assert (event.actor, event.reason, event.data["hostname"]) == ("liveness", "no report", node.hostname)


@pytest.mark.django_db
def test_a_node_change_that_raises_moves_nothing(owned_pool: Pool) -> None:
    node = make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    before = snapshot([owned_pool.id])

    with pytest.raises(ValueError), transaction.atomic(), nodes_changing([node.pk]):
        Node.objects.filter(pk=node.pk).update(cordoned=True)
        raise ValueError("the change failed")

    assert snapshot([owned_pool.id]) == before
    assert not Node.objects.get(pk=node.pk).cordoned


@pytest.mark.django_db(transaction=True)
def test_nodes_changing_refuses_to_run_outside_a_transaction(owned_pool: Pool) -> None:
    """Outside one, the lock and the counts would not hold until the change commits."""
    node = make_node(owned_pool, gpus=2)
    with pytest.raises(RuntimeError), nodes_changing([node.pk]):
        pass  # pragma: no cover - refused before the body


@pytest.mark.django_db
def test_rollups_stay_equal_to_a_rebuild_while_the_clock_runs_past_node_changes(
    owner_client: APIClient, operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    """A cordon, then the bookings on the cordoned node start and end: phases move, the rows stay exact."""
    from reservations.lifecycle.phases import bookings_advance

    api("nodes/cordon", reason="PSU swap")(operator_client, booked)
    set_clock_offset(timedelta(minutes=90))
    try:
        # The first reservation's two bookings ended, the second's one started.
        assert bookings_advance() == 3
        assert by_pool(owner_client, owned_pool)["gpu"] == counts(maintenance=4)
        api("nodes/uncordon")(operator_client, booked)
        assert by_pool(owner_client, owned_pool)["gpu"] == counts(allocatable=4, allocated=1)
        assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
    finally:
        set_clock_offset(timedelta(0))


def test_every_change_of_node_events_keeps_the_inventory_signature() -> None:
    """The operator's actions (`operations.services`, each inside `nodes_changing`) take what
    `inventory.services.nodes` takes, so callers need not know which they call."""
    import inspect

    from inventory.services import nodes as inventory_rows

    for name in ("node_cordon", "node_uncordon", "node_set_maintenance", "node_taint", "node_untaint"):
        wrapper, inner = getattr(operator_actions, name), getattr(inventory_rows, name)
        assert list(inspect.signature(wrapper).parameters) == list(inspect.signature(inner).parameters)
    assert list(inspect.signature(operator_actions.device_set_health).parameters) == [
        "device",
        "healthy",
        "reason",
        "actor",
    ]


@pytest.mark.django_db
def test_nested_node_events_count_each_node_once(owned_pool: Pool) -> None:
    """An outer change (a fleet load around registration and reports) counts its nodes; inner ones do not."""
    first, second = make_node(owned_pool, gpus=2), make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)

    with transaction.atomic(), nodes_changing([first.pk]):
        Node.objects.filter(pk=first.pk).update(noschedule_taints=1)  # a registration that taints
        operator_actions.node_cordon(node=first, reason="inner", actor="ops")  # unhealthy to maintenance
        operator_actions.node_cordon(node=second, reason="inner", actor="ops")  # counted by the inner one

    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.total) == (0, 4, 4)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
