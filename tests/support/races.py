"""The guards' races made deterministic: commit hooks that hold a placement, gates, the statement a
lock wait is in, and the nodes and requests the races are fought over.

Interleavings use the commit's hooks (`reservations.placer.option.HOOKS`, installed by the
`hooks` fixture) and events: a placement is held open at a known point while another transaction
acts, and a transaction that must be waiting on a row lock is observed in `pg_stat_activity`
before the test moves on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection

from core.errors import NoCapacity, QuotaExceeded
from inventory.models import Node, Pool
from reservations.models import DeviceBooking, Reservation
from reservations.request.types import ReservationRequest
from reservations.services import ReservationCreated, reservation_create
from tests.support.factories import DeviceFactory, NodeFactory, NodeResourceFactory
from tests.support.placement import gpu_request
from tests.support.threads import JOIN_SECONDS, Worker, started_until_blocked, transaction_held_open

Hooks = list[Callable[[str, str], None]]

# Events that hold a thread (and its open transaction) until the test lets it go.
_GATES: list[threading.Event] = []


def gate() -> threading.Event:
    """An event a thread waits on; set at the latest when the test ends (`open_every_gate`), pass or fail."""
    event = threading.Event()
    _GATES.append(event)
    return event


def open_every_gate() -> None:
    """Let every held thread go: a failing test (a guard removed) ends at once, not after JOIN_SECONDS."""
    while _GATES:
        _GATES.pop().set()


def one_node(pool: Pool, gpus: int, **fields: Any) -> Node:
    """A node of `pool` with `gpus` whole GPUs (uids `GPU-<node>-<index>`)."""
    node = NodeFactory(pool=pool, **fields)
    for index in range(gpus):
        DeviceFactory(node=node, uid=f"GPU-{node.id}-{index}")
    return node


def bus(index: int) -> str:
    return f"00000000:{0x18 + index:02x}:00.0"


def gpus_by_bus(pool: Pool, gpus: int, *, first_bus: int = 0, **resources: int) -> Node:
    """A node whose GPUs a request can name one by one (`pciBusId`), with scalar `resources`."""
    node = NodeFactory(pool=pool)
    for index in range(first_bus, first_bus + gpus):
        DeviceFactory(
            node=node,
            uid=f"GPU-{node.id}-{index}",
            attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": 0, "pciBusId": bus(index)},
        )
    for resource, amount in resources.items():
        NodeResourceFactory(node=node, resource=resource, allocatable=amount)
    return node


def on_gpu(pool: Pool, index: int, **fields: Any) -> ReservationRequest:
    """One whole GPU, the one on bus `index`: two such requests never queue on one atom."""
    return gpu_request(pool, 1, selector={"pciBusId": {"eq": bus(index)}}, **fields)


def attempt(request: Any) -> Callable[[], Any]:
    """A create of `request`: its result, or the NoCapacity or QuotaExceeded it was refused with."""

    def run() -> Any:
        try:
            return reservation_create(request=request, actor="test")
        except (NoCapacity, QuotaExceeded) as exc:
            return exc

    return run


def hold_two_placements_until_both_planned(hooks: Hooks) -> None:
    """A commit hook that holds each of two placements before its node lock until both got there."""
    both_planned = threading.Barrier(2)
    seen: set[int] = set()

    def rendezvous(point: str, node_id: str) -> None:
        if point == "before_node_lock" and threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            both_planned.wait(JOIN_SECONDS)

    hooks.append(rendezvous)


def hold_first_placement(hooks: Hooks, point: str = "after_locks") -> tuple[threading.Event, threading.Event]:
    """A commit hook that holds the first placement to reach `point` until `go_on` is set.

    Returns `(reached, go_on)`; placements that come later pass the point freely.
    """
    reached = threading.Event()
    go_on = gate()
    claimed = threading.Lock()

    def hold(at: str, node_id: str) -> None:
        if at == point and claimed.acquire(blocking=False):
            reached.set()
            assert go_on.wait(JOIN_SECONDS)

    hooks.append(hold)
    return reached, go_on


def placement_held_after_its_locks(
    hooks: Hooks, request: ReservationRequest
) -> tuple[Worker, threading.Event]:
    """A placement of `request` on its own connection, held once it has planned and taken its locks.

    Returned with the event that lets it go on; its claims and bookings are not made yet.
    """
    reached, go_on = hold_first_placement(hooks)
    placer = Worker(attempt(request))
    placer.start()
    assert reached.wait(JOIN_SECONDS)
    return placer, go_on


def waiting_statement(worker: Worker) -> str:
    """The statement a worker's backend is running (or waiting in)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [worker.pid])
        return str(cursor.fetchone()[0])


def second_placement_after_a_queue(
    lock_rows: Callable[[], Any],
    first: ReservationRequest,
    first_waits_in: str,
    second: ReservationRequest,
    second_waits_in: str,
) -> Any:
    """Two placements queued behind a transaction that holds the rows `lock_rows` locks; the second's outcome.

    The first is stopped by those rows in a statement on `first_waits_in`, holding what it wrote
    before, uncommitted; the second then waits in a statement on `second_waits_in` for a row the
    first holds. Once the rows are let go the first makes its reservation, and the second ends
    without raising: what it answered is returned.
    """
    holder, let_go = transaction_held_open(lock_rows, commit=gate())
    waiting_first = started_until_blocked(attempt(first))
    assert first_waits_in in waiting_statement(waiting_first)
    waiting_second = started_until_blocked(attempt(second))
    assert second_waits_in in waiting_statement(waiting_second)
    let_go.set()
    holder.join_ok()
    assert isinstance(waiting_first.finish(), ReservationCreated), waiting_first.error
    result = waiting_second.finish()
    assert waiting_second.error is None, waiting_second.error
    return result


def assert_no_overlapping_bookings() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM device_bookings a JOIN device_bookings b"
            " ON a.device_id = b.device_id AND a.id < b.id AND a.during && b.during"
        )
        assert cursor.fetchone()[0] == 0


def booked_device_ids(reservation: Reservation | None = None) -> set[int]:
    bookings = DeviceBooking.objects.all()
    if reservation is not None:
        bookings = bookings.filter(allocation__reservation=reservation)
    return set(bookings.values_list("device_id", flat=True))
