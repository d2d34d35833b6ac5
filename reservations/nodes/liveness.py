"""Liveness: a node that stopped reporting becomes `disconnected`.

A node agent reports regularly (`inventory/report`), and every report marks
the node `connected` with `last_heartbeat_at = compute_now()`. A connected node
whose last report is older than `CAPACITY_NODE_STALE_SECONDS` is disconnected
here, through `reservations.nodes.changes.node_set_connectivity`: the guarded
write of the node row the placer locks `FOR SHARE` (guard 4), audited, with
the rollups moved and BookingRepair asked for in the same transaction. Its
next report reconnects it (the report path does that).

Nodes that never reported (`last_heartbeat_at IS NULL`: fleet-file and demo
nodes, which the fleet loader applies with `connect=False`) are never
watched, so they cannot flap between connected and disconnected; the partial
index `node_heartbeat_watch` holds exactly the watched nodes.

Each node is disconnected in its own transaction, re-checked under the node's
lock: a report that committed meanwhile wins (the re-check sees its heartbeat),
and one still in flight holds the row, so the node is skipped (`SKIP LOCKED`)
and the report's own write decides.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from inventory.models import Node

ACTOR = "liveness"

# The connected nodes that reported once and not since the threshold, oldest first
# (served by `node_heartbeat_watch`).
_STALE_SQL = """
SELECT id FROM inventory_node
 WHERE connectivity = 'connected' AND last_heartbeat_at IS NOT NULL
   AND last_heartbeat_at < compute_now() - make_interval(secs => %(seconds)s)
   AND id > %(after)s
 ORDER BY id
 LIMIT %(limit)s
"""

# The same condition on one node, under its row lock; a report in flight holds the row.
_LOCK_STALE_SQL = """
SELECT extract(epoch FROM compute_now() - last_heartbeat_at)::bigint,
       compute_now() - make_interval(secs => %(seconds)s)
  FROM inventory_node
 WHERE id = %(node)s AND connectivity = 'connected' AND last_heartbeat_at IS NOT NULL
   AND last_heartbeat_at < compute_now() - make_interval(secs => %(seconds)s)
   FOR UPDATE SKIP LOCKED
"""


def stale_seconds() -> float:
    """How long a node may stay silent before it is disconnected (`CAPACITY_NODE_STALE_SECONDS`)."""
    return float(settings.CAPACITY_NODE_STALE_SECONDS)


def _disconnect_if_stale(node_id: str, seconds: float) -> bool:
    from reservations.nodes.changes import node_set_connectivity

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_LOCK_STALE_SQL, {"node": node_id, "seconds": seconds})
            row = cursor.fetchone()
        if row is None:
            return False  # it reported meanwhile, or a report holds it now
        silent, cutoff = row
        node = node_set_connectivity(
            node=Node.objects.get(pk=node_id),
            connected=False,
            actor=ACTOR,
            reason=f"no report for {int(silent)}s",
            heartbeat_before=cutoff,
        )
    return node.connectivity != "connected"


def nodes_mark_stale(*, limit: int = 500) -> int:
    """Disconnect connected nodes whose last report is older than the threshold; return how many.

    Walks the stale nodes by id in pages of `limit`, one transaction per node,
    so a mass outage is worked through without one long transaction and a
    second worker (or a report) never waits on this one.
    """
    seconds = stale_seconds()
    disconnected = 0
    after = ""
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_STALE_SQL, {"seconds": seconds, "after": after, "limit": limit})
            page = [row[0] for row in cursor.fetchall()]
        for node_id in page:
            if _disconnect_if_stale(node_id, seconds):
                disconnected += 1
        if len(page) < limit:
            return disconnected
        after = page[-1]


def liveness_next_deadline() -> datetime | None:
    """When the next watched node turns stale if it sends nothing: its last report plus the threshold."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(last_heartbeat_at) FROM inventory_node"
            " WHERE connectivity = 'connected' AND last_heartbeat_at IS NOT NULL"
        )
        row = cursor.fetchone()
    oldest: datetime | None = row[0] if row else None
    if oldest is None:
        return None
    return oldest + timedelta(seconds=stale_seconds())
