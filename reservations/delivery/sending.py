"""What a delivery tells the nodes: one outbox row's news, sent to the node daemon or the node's agent.

"assign" sends the reservation's assignments (`daemon_deliver`); "shorten"
brings the nodes' records in line with its cut bookings (`daemon_shorten`).
A node that refuses an assignment (guard 6) leaves the reservation to the
control plane: `assignment_refused` is sent, inside the delivery's
transaction, and `reservations.services` releases the reservation on it. The
delivery never imports the services: they write its rows
(`reservations.delivery.outbox`), so the news goes up by the signal.
"""

from __future__ import annotations

from django.db import connection, transaction

from reservations.delivery.agent import SHORTEN_NODE_IDS_SQL, agent_changes_enqueue
from reservations.delivery.daemon import (
    SHORTEN_LOCK_SQL,
    daemon_behind,
    daemon_deliver,
    daemon_open,
    daemon_shorten,
)
from reservations.delivery.signals import assignment_refused
from reservations.models import DeliveryKind, Reservation


def delivery_send(*, reservation_id: str, kind: str) -> None:
    """Tell the nodes one outbox row's news (the outbox calls this); raises when a node cannot be reached.

    "assign" sends the reservation's assignments, releasing it if a node
    refuses (guard 6); "shorten" brings the nodes' records in line with its
    cut bookings.
    """
    if kind == DeliveryKind.ASSIGN:
        live, daemon_nodes, agent_nodes = daemon_open(reservation_id=reservation_id)
        if live and daemon_nodes:
            _deliver_or_release(reservation_id=reservation_id, node_ids=daemon_nodes)
        # Nodes with their own agent hear it as a change they pull (`reservations.delivery.agent`);
        # their answer comes later, and a refusal releases the reservation then.
        agent_changes_enqueue(reservation_id=reservation_id, kind=kind, node_ids=agent_nodes)
    else:
        held, agent_nodes = _shorten_open(reservation_id)
        daemon_shorten(reservation_id=reservation_id, held=held)
        agent_changes_enqueue(reservation_id=reservation_id, kind=kind, node_ids=agent_nodes)


# A shorten's two questions in one round trip: the daemons of the nodes that hold the
# reservation, held (how many), and the agent nodes to tell.
_SHORTEN_OPEN_SQL = f"SELECT ({SHORTEN_LOCK_SQL}), ARRAY({SHORTEN_NODE_IDS_SQL})"


def _shorten_open(reservation_id: str) -> tuple[int, list[str]]:
    with connection.cursor() as cursor:
        cursor.execute(_SHORTEN_OPEN_SQL, {"reservation": reservation_id, "node": None, "id": reservation_id})
        row = cursor.fetchone()
    assert row is not None
    return int(row[0] or 0), list(row[1])


def reservation_deliver(*, reservation_id: str) -> bool:
    """Tell the nodes about a committed reservation; on a refusal, `assignment_refused` (guard 6).

    True if every node accepted (or the reservation no longer runs, so there
    is nothing to tell). The release the refusal brings writes its own
    "shorten" delivery, which drops what the other nodes of a gang accepted.
    """
    with transaction.atomic():  # the daemons held by `daemon_open` stay held while they are told
        live, daemon_nodes, _ = daemon_open(reservation_id=reservation_id)
        if not live or not daemon_nodes:
            return True
        return _deliver_or_release(reservation_id=reservation_id, node_ids=daemon_nodes)


def _deliver_or_release(*, reservation_id: str, node_ids: list[str]) -> bool:
    refusal = daemon_deliver(reservation_id=reservation_id, node_ids=node_ids)
    if refusal is None:
        return True
    if not assignment_refused.has_listeners(Reservation):
        # Never a silent guard 6: a process that delivers has the services loaded (`ReservationsConfig`).
        raise RuntimeError("a node refused an assignment and nothing releases the reservation")
    assignment_refused.send(sender=Reservation, reservation_id=reservation_id, refusal=refusal)
    return False


def reservations_redeliver(*, limit: int = 500) -> int:
    """Catch the nodes up on live reservations they lack or hold uncut; return how many were behind.

    Not scheduled: the outbox delivers every change. This is the resync for a
    node that lost its own record (reinstalled, restored from an old backup).
    """
    behind = daemon_behind(limit=limit)
    for reservation_id in behind:
        daemon_shorten(reservation_id=reservation_id)
        reservation_deliver(reservation_id=reservation_id)
    return len(behind)
