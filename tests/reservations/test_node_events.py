"""Node events: a node or device change moves the node's atoms between the rollup counts at once.

Operators act over HTTP (`nodes/*`, `devices/setHealth`), node agents report
over HTTP (`inventory/report`), liveness calls `node_set_connectivity`; the
numbers are read over HTTP (`capacity/byPool`) in the same breath, and the
rows must equal a rebuild's recount in whatever state the fleet is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from core.clock import set_clock_offset
from core.constants import WORKER_CHANNEL
from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import Reservation
from reservations.nodes import changes as node_events
from reservations.nodes.changes import nodes_changing
from reservations.rollups.recount import rollup_rebuild, rollup_recount
from reservations.waits import LISTENER, RELEASE_CHANNEL
from tests.support.api import post, reservation_body
from tests.support.clock import HOUR_MS, now_ms
from tests.support.factories import NodeFactory, PoolFactory, TenantFactory
from tests.support.notifications import listening
from tests.support.placement import make_node
from tests.support.records import audit_trail, snapshot, snapshot_after_rebuild
from tests.support.threads import JOIN_SECONDS, Worker, wait_until_blocked_on_lock

COUNTS = ("allocatable", "allocated", "reserved", "maintenance", "unhealthy", "unreachable")


def by_pool(client: APIClient, pool: Pool) -> dict[str, dict[str, int]]:
    """`capacity/byPool` as {resource: {count: n}}, for the counts a node event moves."""
    answer = post(client, "capacity/byPool", {"tenantId": pool.owner_id, "poolId": pool.id})
    assert answer.status_code == 200, answer.json()
    return {row["resource"]: {name: row[name] for name in COUNTS} for row in answer.json()["rows"]}


def counts(**given: int) -> dict[str, int]:
    return {name: given.get(name, 0) for name in COUNTS}


@pytest.fixture
def booked(owner_client: APIClient, owned_pool: Pool) -> Node:
    """A node with 4 GPUs and 64 vCPUs: 2 GPUs and 8 vCPUs run now, 1 GPU is booked from an hour on."""
    node = make_node(owned_pool, gpus=4, resources={"vcpu": 64})
    rollup_rebuild(pool_id=owned_pool.id)
    now = reservation_body(owned_pool, "acme", "now", gpus=2, resources={"vcpu": 8})
    later = reservation_body(owned_pool, "acme", "later", gpus=1, start=now_ms() + HOUR_MS)
    for body in (now, later):
        created = post(owner_client, "reservations/create", body)
        assert created.status_code == 201, created.json()
    return node


# Each: (do it, undo it, what byPool shows in between). The node is `booked`.
Change = Callable[[APIClient, Node], Any]


def api(method: str, **fields: Any) -> Change:
    def run(client: APIClient, node: Node) -> Any:
        answer = post(client, method, {"nodeId": node.pk, **fields})
        assert answer.status_code == 200, answer.json()

    return run


def health(healthy: bool) -> Change:
    def run(client: APIClient, node: Node) -> Any:
        # The first GPU (by uid) carries the running reservation's booking or is free: either way it moves.
        device = node.devices.order_by("uid").first()
        assert device is not None
        body = {"deviceUid": device.uid, "healthy": healthy, "reason": "xid 79"}
        answer = post(client, "devices/setHealth", body)
        assert answer.status_code == 200, answer.json()

    return run


def connectivity(connected: bool) -> Change:
    def run(client: APIClient, node: Node) -> Any:
        node_events.node_set_connectivity(
            node=node, connected=connected, actor="liveness", reason="no report"
        )

    return run


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
def test_a_disconnect_loses_to_a_report_newer_than_its_cutoff(
    node_agent_client: APIClient, owned_pool: Pool
) -> None:
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-r-001")
    assert (
        post(node_agent_client, "inventory/report", {"nodeId": node.pk, "report": a_report(node)}).status_code
        == 200
    )
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None
    cutoff = node.last_heartbeat_at  # liveness read the node as stale before this report came in

    kept = node_events.node_set_connectivity(
        node=node, connected=False, actor="liveness", reason="stale", heartbeat_before=cutoff
    )
    assert kept.connectivity == "connected"
    gone = node_events.node_set_connectivity(
        node=node,
        connected=False,
        actor="liveness",
        reason="stale",
        heartbeat_before=cutoff + timedelta(seconds=1),
    )
    assert gone.connectivity == "disconnected"
    assert audit_trail(node) == ["node.disconnected"]


# --- Reports -------------------------------------------------------------------------------


def a_report(node: Node, *, gpus: int = 1, vcpu: int = 224, mig: list[str] | None = None) -> dict[str, Any]:
    """A report of `gpus` H100s (the first with the MIG instances `mig`, if given) and `vcpu` vCPUs."""
    reported = []
    for index in range(gpus):
        instances = [
            {"gi": gi, "ci": 0, "profile": profile, "memoryMiB": 40192}
            for gi, profile in enumerate(mig or [])
        ]
        reported.append(
            {
                "uuid": f"GPU-{node.hostname}-{index}",
                "product": "NVIDIA H100 80GB HBM3",
                "memoryMiB": 81559,
                "numaNode": 0,
                "mig": {"enabled": bool(mig) and index == 0, "instances": instances if index == 0 else []},
            }
        )
    return {"hostname": node.hostname, "resources": {"vcpu": vcpu, "memoryGiB": 1024}, "gpus": reported}


def report(client: APIClient, node: Node, **shape: Any) -> None:
    answer = post(client, "inventory/report", {"nodeId": node.pk, "report": a_report(node, **shape)})
    assert answer.status_code == 200, answer.json()


@pytest.mark.django_db
def test_new_inventory_shows_at_once_and_vanished_inventory_leaves_at_once(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-n-001")

    report(node_agent_client, node, gpus=4, vcpu=224)
    rows = by_pool(owner_client, owned_pool)
    assert rows["gpu"] == counts(allocatable=6)
    assert rows["vcpu"] == counts(allocatable=224)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)

    report(node_agent_client, node, gpus=1, vcpu=100)
    rows = by_pool(owner_client, owned_pool)
    assert (rows["gpu"]["allocatable"], rows["vcpu"]["allocatable"]) == (3, 100)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_a_report_reconnects_a_disconnected_node_on_the_record_and_in_the_counts(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-c-001")
    report(node_agent_client, node, gpus=2)
    node_events.node_set_connectivity(
        node=node, connected=False, actor="liveness", reason="no report for 120s"
    )
    assert by_pool(owner_client, owned_pool)["gpu"] == counts(unreachable=2)

    report(node_agent_client, node, gpus=2)

    assert by_pool(owner_client, owned_pool)["gpu"] == counts(allocatable=2)
    assert audit_trail(node) == ["node.disconnected", "node.connected"]
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
    report(node_agent_client, node, gpus=2)  # a connected node's report is no reconnect
    assert audit_trail(node) == ["node.disconnected", "node.connected"]


@pytest.mark.django_db
def test_a_layout_change_counts_its_bookings_as_running_on_the_new_atoms(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-m-001")
    report(node_agent_client, node, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)

    report(node_agent_client, node, gpus=2, mig=["3g.40gb", "3g.40gb"])

    rows = by_pool(owner_client, owned_pool)
    # The MIG GPU is no atom now; its two instances are, booked (guard 2) for the change window.
    assert rows["gpu"] == counts(allocatable=1)
    assert rows["gpu.mig"] == counts(allocatable=2, allocated=2)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db
def test_rows_of_resources_a_pool_no_longer_has_go_as_a_rebuild_drops_them(
    node_agent_client: APIClient, owner_client: APIClient, owned_pool: Pool
) -> None:
    node = NodeFactory.create(pool=owned_pool, hostname="gpu-v-001")
    report(node_agent_client, node, gpus=1, mig=["3g.40gb", "3g.40gb"])
    assert "gpu.mig" in by_pool(owner_client, owned_pool)
    with connection.cursor() as cursor:  # the change window passed: the layout bookings are history
        cursor.execute("DELETE FROM device_bookings")
    rollup_rebuild(pool_id=owned_pool.id)

    report(node_agent_client, node, gpus=1)

    assert "gpu.mig" not in by_pool(owner_client, owned_pool)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


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
def test_a_scalar_only_node_report_keeps_a_gpu_row_for_the_pool(
    node_agent_client: APIClient, owner_client: APIClient
) -> None:
    pool = PoolFactory.create(owner=TenantFactory.create(id="acme"), name="cpu-only")
    node = NodeFactory.create(pool=pool, hostname="cpu-001")
    report(node_agent_client, node, gpus=0, vcpu=32)
    rows = by_pool(owner_client, pool)
    assert rows["gpu"] == counts()
    assert (rows["node"]["allocatable"], rows["vcpu"]["allocatable"]) == (1, 32)
    assert snapshot([pool.id]) == snapshot_after_rebuild(pool)


# --- Wake-ups ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_booked_atoms_leaving_the_counted_set_ask_the_worker_for_repair(
    operator_client: APIClient, owned_pool: Pool, booked: Node
) -> None:
    with listening(WORKER_CHANNEL) as worker:
        api("nodes/cordon", reason="PSU swap")(operator_client, booked)
        assert worker.next() == "repair"
    with listening(WORKER_CHANNEL) as worker:
        api("nodes/uncordon")(operator_client, booked)  # capacity back: nothing to repair
        assert worker.none()


@pytest.mark.django_db(transaction=True)
def test_capacity_coming_back_wakes_the_waiters_of_the_pool(
    operator_client: APIClient, node_agent_client: APIClient, owned_pool: Pool
) -> None:
    node = make_node(owned_pool, gpus=2, cordoned=True)
    with listening(RELEASE_CHANNEL) as waiters:
        api("nodes/uncordon")(operator_client, node)
        assert waiters.next() == owned_pool.id
        api("nodes/taint", key="k", effect="NoSchedule", reason="xid")(operator_client, node)
        api("nodes/untaint", key="k")(operator_client, node)
        assert waiters.next() == owned_pool.id
        fresh = NodeFactory.create(pool=owned_pool, hostname="gpu-w-001")
        report(node_agent_client, fresh, gpus=1)
        assert waiters.next() == owned_pool.id
        api("nodes/cordon", reason="again")(operator_client, node)  # capacity fell: nobody to wake
        assert waiters.none()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_create_is_woken_by_an_uncordon_and_succeeds(
    owner_client: APIClient, operator_client: APIClient, owned_pool: Pool
) -> None:
    node = make_node(owned_pool, gpus=2, cordoned=True)
    rollup_rebuild(pool_id=owned_pool.id)
    body = reservation_body(owned_pool, "acme", "patient", gpus=2, wait={"timeoutMs": 30000})
    create = Worker(lambda: post(owner_client, "reservations/create", body))
    create.start()
    deadline = time.monotonic() + JOIN_SECONDS
    while LISTENER.waiting() == 0 and create.is_alive():
        assert time.monotonic() < deadline, "the create never waited"
        time.sleep(0.01)
    assert create.is_alive(), f"the create did not wait: {create.result or create.error!r}"

    with listening(RELEASE_CHANNEL) as waiters:
        api("nodes/uncordon")(operator_client, node)
        assert waiters.next() == owned_pool.id  # the wake-up the waiting create hears

    answer = create.finish()
    assert create.error is None
    assert answer.status_code == 201, answer.json()
    assert answer.json().get("error", {}).get("code") != "NO_CAPACITY"
    assert len(answer.json()["allocations"][0]["atoms"]) == 2


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
    """The wrappers take what `inventory.services.nodes` takes, so callers need not know which they call."""
    import inspect

    from inventory.services import nodes as operations

    for name in ("node_cordon", "node_uncordon", "node_set_maintenance", "node_taint", "node_untaint"):
        wrapper, inner = getattr(node_events, name), getattr(operations, name)
        assert list(inspect.signature(wrapper).parameters) == list(inspect.signature(inner).parameters)
    assert list(inspect.signature(node_events.device_set_health).parameters) == [
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
        node_events.node_cordon(node=first, reason="inner", actor="ops")  # unhealthy to maintenance
        node_events.node_cordon(node=second, reason="inner", actor="ops")  # counted by the inner one

    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.total) == (0, 4, 4)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


# --- Node events against the worker and a release, on real connections -------------------------


def cordon_held_open(node: Node, cordoned: threading.Event, commit: threading.Event) -> Callable[[], Any]:
    """A cordon on its own connection, its transaction kept open until `commit` is set."""

    def run() -> Any:
        set_clock_offset(timedelta(minutes=90))
        with transaction.atomic():
            node_events.node_cordon(node=node, reason="PSU swap", actor="ops")
            cordoned.set()
            assert commit.wait(JOIN_SECONDS)

    return run


@pytest.fixture
def two_nodes_booked_later(owner_client: APIClient, owned_pool: Pool) -> Iterator[tuple[Node, str]]:
    """Two nodes of 2 GPUs, each with a reservation of both from an hour on; every clock 90 minutes on."""
    make_node(owned_pool, gpus=2)
    make_node(owned_pool, gpus=2)
    rollup_rebuild(pool_id=owned_pool.id)
    ids = []
    for key in ("a", "b"):
        body = reservation_body(owned_pool, "acme", key, gpus=2, start=now_ms() + HOUR_MS)
        created = post(owner_client, "reservations/create", body)
        assert created.status_code == 201, created.json()
        ids.append(created.json()["id"])
    first = Reservation.objects.get(pk=ids[0]).allocations.get().node
    set_clock_offset(timedelta(minutes=90))
    yield first, ids[0]
    set_clock_offset(timedelta(0))


@pytest.mark.django_db(transaction=True)
def test_an_advance_waits_for_a_cordon_of_the_node_and_counts_what_the_cordon_left(
    owned_pool: Pool, two_nodes_booked_later: tuple[Node, str]
) -> None:
    from reservations.lifecycle.phases import bookings_advance

    node, _ = two_nodes_booked_later
    cordoned, commit = threading.Event(), threading.Event()
    cordon = Worker(cordon_held_open(node, cordoned, commit))
    cordon.start()
    assert cordoned.wait(JOIN_SECONDS)

    def advancing() -> int:
        set_clock_offset(timedelta(minutes=90))
        return bookings_advance()

    advance = Worker(advancing)
    advance.start()
    wait_until_blocked_on_lock(advance)  # on the node the cordon holds
    commit.set()
    cordon.join_ok()
    advance.join_ok()

    assert advance.result == 4
    # The cordoned node's bookings left the counts with the cordon; only the other node's moved.
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 2, 0)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)


@pytest.mark.django_db(transaction=True)
def test_a_release_waits_for_a_cordon_of_its_node_and_gives_back_only_what_is_counted(
    owned_pool: Pool, two_nodes_booked_later: tuple[Node, str]
) -> None:
    from reservations.services import reservation_release

    node, reservation_id = two_nodes_booked_later
    cordoned, commit = threading.Event(), threading.Event()
    cordon = Worker(cordon_held_open(node, cordoned, commit))
    cordon.start()
    assert cordoned.wait(JOIN_SECONDS)

    def release() -> Any:
        set_clock_offset(timedelta(minutes=90))
        return reservation_release(reservation=Reservation.objects.get(pk=reservation_id), actor="tenant")

    releasing = Worker(release)
    releasing.start()
    wait_until_blocked_on_lock(releasing)  # on the node the cordon holds
    commit.set()
    cordon.join_ok()
    releasing.join_ok()

    # Nothing runs yet (no advance): the other node's two bookings are still reserved.
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 0, 2)
    recount = rollup_recount(pool_ids=[owned_pool.id])
    assert all(getattr(row, name) == n for name, n in recount[(owned_pool.id, "gpu")].items())
    # A rebuild first starts the other node's bookings (with their delta), and agrees.
    before = snapshot([owned_pool.id])
    assert snapshot_after_rebuild(owned_pool) != before
    row = owned_pool.rollups.get(resource="gpu")
    assert (row.allocatable, row.maintenance, row.allocated, row.reserved) == (2, 2, 2, 0)
    assert snapshot([owned_pool.id]) == snapshot_after_rebuild(owned_pool)
