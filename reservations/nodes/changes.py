"""Node and device changes with their consequences: rollups at once, waits woken, repair asked for.

Every node or device change runs its inventory write (`inventory.services.nodes`)
inside `nodes_changing`: the operators' actions (`operations.services`), node
reports (`reservations.nodes.reports`) and liveness (`node_set_connectivity`,
here). In the same transaction it:

* locks the nodes `FOR UPDATE` (id order), so no placement, release or
  booking phase move on them interleaves (they hold the nodes `FOR SHARE`);
* counts what the nodes contribute to their pools' rollup rows before and
  after the change (`reservations.rollups.counts`, the rebuild's own definition) and
  applies the difference (`reservations.rollups.deltas.rollup_apply_count_deltas`), so a
  cordon shows in `capacity/byPool` at once and the rows stay equal to a
  rebuild in any fleet state;
* wakes the creates waiting on a pool whose capacity rose (an uncordon, an
  untaint, a reconnect, a device healthy again, new inventory);
* asks the worker for BookingRepair (`repair_requested`: a `RepairRequest`
  row naming each node, and `pg_notify(WORKER_CHANNEL, 'repair')`) when atoms
  carrying FUTURE or RUNNING bookings left the counted set, and when capacity
  came back to a node already counted (an at-risk mark then clears at the
  worker's next pass, not after the releases' cooldown). The run reads the
  named nodes' bookings, not the fleet's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.db import connection, transaction

from core.constants import WORKER_CHANNEL
from inventory.models import Node
from inventory.services import nodes as node_rows
from reservations.rollups.counts import COUNT_COLUMNS, NODES_COUNT_SQL
from reservations.rollups.deltas import rollup_apply_count_deltas, rollup_rows_drop_unused
from reservations.waits import notify_release

__all__ = ["node_set_connectivity", "nodes_changing", "nodes_contribution", "repair_requested"]

Counts = dict[tuple[str, str], dict[str, int]]

# What `nodes_changing` asks of the worker when booked atoms leave the counted set.
REPAIR_WAKE = "repair"


def _lock(node_ids: list[str]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM inventory_node WHERE id = ANY(%s::varchar[]) ORDER BY id FOR UPDATE", [node_ids]
        )
        cursor.fetchall()


def nodes_contribution(node_ids: list[str]) -> Counts:
    """What these nodes add to their pools' rollup rows: `{(pool, resource): {count: n}}` (one statement)."""
    with connection.cursor() as cursor:
        cursor.execute(NODES_COUNT_SQL, {"nodes": node_ids})
        return {
            (pool_id, resource): dict(zip(COUNT_COLUMNS, counts, strict=True))
            for pool_id, resource, *counts in cursor.fetchall()
        }


def repair_requested(node_ids: Iterable[str]) -> None:
    """Ask BookingRepair to look at these nodes' bookings: one row each, seen when this transaction commits.

    One row per node and change (no upsert): a run deletes only the rows it
    read, so a change committed while it ran is looked at by the next one.
    """
    ids = sorted(set(node_ids))
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH named AS (INSERT INTO repair_requests (node_id) SELECT unnest(%s::varchar[]))"
            " SELECT pg_notify(%s, %s)",
            [ids, WORKER_CHANNEL, REPAIR_WAKE],
        )


def _apply(before: Counts, after: Counts, node_ids: list[str]) -> None:
    """Apply the difference of two counts of the same nodes, then wake who should be woken."""
    deltas: Counts = {}
    dropped: dict[str, list[str]] = {}
    rose: set[str] = set()
    repair = False
    zero = dict.fromkeys(COUNT_COLUMNS, 0)
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, zero), after.get(key, zero)
        moved = {column: new[column] - old[column] for column in COUNT_COLUMNS if column != "present"}
        if any(moved.values()) or (new["present"] and not old["present"]):
            deltas[key] = moved
        if old["present"] and not new["present"]:
            dropped.setdefault(key[0], []).append(key[1])
        if moved["allocatable"] > 0:
            rose.add(key[0])
            # Capacity came back to nodes already counted (an uncordon, a node out of
            # maintenance, a device healthy again; not new inventory): a reservation marked
            # at risk may fit now, so repair at once, not after the releases' cooldown.
            repair = repair or bool(old["present"])
        if moved["allocated"] < 0 or moved["reserved"] < 0:
            repair = True
    if not deltas and not dropped:
        return
    # Every pool keeps a gpu row, as the rebuild writes it.
    for pool_id in {pool_id for pool_id, _ in deltas}:
        deltas.setdefault((pool_id, "gpu"), {})
    rollup_apply_count_deltas(deltas=deltas)
    for pool_id, resources in sorted(dropped.items()):
        rollup_rows_drop_unused(pool_id=pool_id, resources=resources)
    for pool_id in sorted(rose):
        notify_release(pool_id=pool_id)
    if repair:
        repair_requested(node_ids)


# The nodes an enclosing `nodes_changing` already counts: a nested one leaves them to it
# (counting them twice would apply their difference twice).
_covered: ContextVar[frozenset[str]] = ContextVar("nodes_changing_covered", default=frozenset())


@contextmanager
def nodes_changing(node_ids: Iterable[str]) -> Iterator[None]:
    """Around a change of these nodes (or their devices, taints, scalars): move the rollups with it.

    Use inside `transaction.atomic()`: the nodes are locked `FOR UPDATE` in id
    order, counted, the body runs, they are counted again and the difference
    is applied before the caller commits. A body that raises applies nothing.
    Nested calls are safe: nodes an enclosing call counts are counted once,
    by it (a fleet load can wrap registration and reports together).
    """
    covered = _covered.get()
    ids = sorted(set(node_ids) - covered)
    if not ids:
        yield
        return
    if not connection.in_atomic_block:
        raise RuntimeError("nodes_changing runs inside transaction.atomic()")
    _lock(ids)
    before = nodes_contribution(ids)
    token = _covered.set(covered | frozenset(ids))
    try:
        yield
    finally:
        _covered.reset(token)
    _apply(before, nodes_contribution(ids), ids)


def node_set_connectivity(
    *, node: Node, connected: bool, actor: str, reason: str, heartbeat_before: datetime | None = None
) -> Node:
    """Mark the node connected or disconnected; its atoms move to or from `unreachable` at once.

    Liveness passes `heartbeat_before` (its staleness cutoff): the node is then
    disconnected only if its last report is still older, so a report that
    arrived meanwhile wins. The node is locked before the check.
    """
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_set_connectivity(
            node=node, connected=connected, actor=actor, reason=reason, heartbeat_before=heartbeat_before
        )
