"""The agent transport: what a node with its own agent is told, and what it answered.

A node registered by its agent (`Node.agent`) is not told through the stand-in
daemon. Its news is written as `NodeChange` rows, one per node and message, in
the delivery's transaction (`agent_changes_enqueue`). The agent pulls them in
id order (`node_changes_after`, the `nodes/assignments` method), applies them
to its own store, and answers each (`node_change_answer`, `nodes/ack`). A row
stays unanswered until the agent answers it, across restarts of the agent and
of the server. An agent that restarts asks again from the last id it applied,
and answers again what it had answered.

The node's refusal (guard 6) is its answer `accepted: false` to an "assign". The
answer is recorded, and `assignment_refused` is sent in the same transaction,
exactly as a refusal from the daemon is: the reservation is released, and its
"shorten" reaches every node of it, the agent's included. Its acceptance may
say where the node put the workload (its cgroup's CPUs and NUMA nodes): that
`placement` is kept on the reservation's allocation on the node.

A change carries what the node needs to enforce the booking: an "assign" says
whether the reservation is spot, and a spot reservation's changes, once its
preemption notice is given, carry the notice (the node writes it where the
workload reads it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.clock import to_millis
from core.errors import InvalidInput, NotFound
from reservations.delivery.daemon import AllocationFailed
from reservations.delivery.signals import assignment_refused
from reservations.models import Allocation, DeliveryKind, NodeChange, Reservation

# The channel an agent's long poll waits on; the payload is the node's id.
NODE_CHANGES_CHANNEL = "node_changes"
# At most this many changes in one answer; the agent asks again from the last.
CHANGES_PAGE = 100


def agent_node_ids(*, reservation_id: str) -> list[str]:
    """The reservation's nodes that have an agent, in id order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT a.node_id FROM reservations_allocation a"
            " JOIN inventory_node n ON n.id = a.node_id WHERE a.reservation_id = %s AND n.agent ORDER BY 1",
            [reservation_id],
        )
        return [node_id for (node_id,) in cursor.fetchall()]


def _windows(reservation_id: str, node_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per node: the allocation's atoms, window, scalar claims and profile, as booked now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.node_id, a.resources, r.request -> 'node', d.uid, lower(b.during), upper(b.during)"
            " FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id"
            " LEFT JOIN device_bookings b ON b.allocation_id = a.id"
            " LEFT JOIN inventory_device d ON d.id = b.device_id"
            " WHERE a.reservation_id = %s AND a.node_id = ANY(%s) ORDER BY a.node_id, d.uid",
            [reservation_id, node_ids],
        )
        out: dict[str, dict[str, Any]] = {}
        for node_id, resources, profile, uid, start, end in cursor.fetchall():
            entry = out.setdefault(
                node_id,
                {"atoms": [], "start": None, "end": None, "resources": _json(resources) or {}},
            )
            entry["profile"] = _json(profile)
            if uid is not None:
                entry["atoms"].append(uid)
                entry["start"] = start if entry["start"] is None else min(entry["start"], start)
                entry["end"] = end if entry["end"] is None else max(entry["end"], end)
    return out


def _ratios(node_id: str) -> dict[str, float]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT resource, ratio FROM inventory_noderesource WHERE node_id = %s", [node_id])
        return {name: float(ratio) for name, ratio in cursor.fetchall()}


def _json(value: Any) -> Any:
    # Django hands raw jsonb columns back as text.
    return json.loads(value) if isinstance(value, str) else value


def _ms(value: datetime | None) -> int | None:
    return None if value is None else to_millis(value)


def agent_changes_enqueue(*, reservation_id: str, kind: str, node_ids: list[str] | None = None) -> int:
    """Write one change per agent node of the reservation, as booked now; return how many.

    Inside the delivery's transaction: the rows commit with the outbox row's
    deletion, and the NOTIFY wakes the nodes' long polls at that commit. Per
    node, the writers take turns (a transaction-scoped lock), so the ids of
    one node's changes commit in increasing order and an agent that asks for
    what follows its last id never misses one that committed late. `node_ids`:
    the nodes to tell, when the caller has read them (an assign's agent nodes,
    `SHORTEN_NODE_IDS_SQL`'s for a shorten).
    """
    if kind == DeliveryKind.SHORTEN and node_ids is None:
        # A node the reservation left (BookingRepair moved it) has no allocation any more, but
        # was told of it: it hears that nothing is left there.
        node_ids = _shorten_node_ids(reservation_id)
    elif node_ids is None:
        node_ids = agent_node_ids(reservation_id=reservation_id)
    if not node_ids:
        return 0
    with connection.cursor() as cursor:
        for node_id in node_ids:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('agent-changes:' || %s, 0))", [node_id]
            )
    windows = _windows(reservation_id, node_ids)
    for node_id in node_ids:
        window = windows.get(node_id, {"atoms": []})
        if kind == DeliveryKind.ASSIGN and window["atoms"]:
            # As the daemon refreshes holders before it refuses: a reservation the node may still
            # hold on these atoms, whose bookings were cut since, hears of the cut first.
            for holder in _cut_holders(node_id, reservation_id, window["atoms"]):
                _write(node_id, holder, DeliveryKind.SHORTEN, _windows(holder, [node_id]).get(node_id))
        _write(node_id, reservation_id, kind, window)
    return len(node_ids)


# A shorten's nodes: the reservation's agent nodes, and those whose last word on it was not
# "nothing is left" (an end of 0), in id order. Takes `%(id)s`, the reservation.
SHORTEN_NODE_IDS_SQL = (
    "SELECT a.node_id FROM reservations_allocation a"
    " JOIN inventory_node n ON n.id = a.node_id WHERE a.reservation_id = %(id)s AND n.agent"
    " UNION SELECT node_id FROM (SELECT DISTINCT ON (node_id) node_id,"
    " (payload ->> 'end')::bigint AS told_end FROM reservations_nodechange"
    " WHERE reservation_id = %(id)s ORDER BY node_id, id DESC) last"
    " WHERE told_end IS DISTINCT FROM 0 ORDER BY 1"
)


def _shorten_node_ids(reservation_id: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(SHORTEN_NODE_IDS_SQL, {"id": reservation_id})
        return [node_id for (node_id,) in cursor.fetchall()]


def _write(node_id: str, reservation_id: str, kind: str, window: dict[str, Any] | None) -> None:
    window = window or {"atoms": [], "start": None, "end": None}
    start, end = _ms(window.get("start")), _ms(window.get("end"))
    payload: dict[str, Any] = {"kind": kind, "reservationId": reservation_id, "start": start, "end": end}
    if kind == DeliveryKind.ASSIGN:
        if not window["atoms"]:
            return  # nothing booked on the node any more: its shorten says so
        payload |= {
            "atoms": window["atoms"],
            "resources": {name: int(amount) for name, amount in window["resources"].items()},
            "profile": window.get("profile"),
            # The overcommit the control plane books scalars under: the node checks its claims
            # against what it reported times these (guard 6), as the stand-in daemon does.
            "ratios": _ratios(node_id),
        }
    elif start is None:
        # No booking left on the node: the end is the start, which removes the holding.
        payload |= {"start": 0, "end": 0}
    payload |= _spot_terms(reservation_id, kind)
    NodeChange.objects.create(node_id=node_id, reservation_id=reservation_id, kind=kind, payload=payload)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NODE_CHANGES_CHANNEL, node_id])


def _spot_terms(reservation_id: str, kind: str) -> dict[str, Any]:
    """An assign's `spot`, and a noticed spot reservation's `notice` (on an assign or a shorten)."""
    spot, notice_at, notice_ends_at = (
        Reservation.objects.filter(pk=reservation_id).values_list("spot", "notice_at", "notice_ends_at").get()
    )
    terms: dict[str, Any] = {"spot": spot} if kind == DeliveryKind.ASSIGN else {}
    if spot and notice_at is not None:
        terms["notice"] = {"givenAt": to_millis(notice_at), "endsAt": _ms(notice_ends_at)}
    return terms


def _cut_holders(node_id: str, reservation_id: str, atoms: list[str]) -> list[str]:
    """Other reservations told of any of `atoms` on the node whose last told end is past their booked end."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT ON (c.reservation_id) c.reservation_id, (c.payload ->> 'end')::bigint
              FROM reservations_nodechange c
             WHERE c.node_id = %(node)s AND c.reservation_id <> %(reservation)s
               AND c.reservation_id IN (
                   SELECT reservation_id FROM reservations_nodechange
                    WHERE node_id = %(node)s AND kind = 'assign' AND payload -> 'atoms' ?| %(atoms)s::text[])
             ORDER BY c.reservation_id, c.id DESC
            """,
            {"node": node_id, "reservation": reservation_id, "atoms": atoms},
        )
        told = cursor.fetchall()
    cut = []
    for holder, told_end in told:
        booked = _windows(holder, [node_id]).get(node_id)
        booked_end = _ms(booked.get("end")) if booked else None
        # A told end of 0 is a removal already told.
        if told_end and (booked_end is None or booked_end < told_end):
            cut.append(holder)
    return cut


def node_changes_after(*, node_id: str, after: int, limit: int = CHANGES_PAGE) -> list[dict[str, Any]]:
    """The node's changes with an id above `after`, in order, each with its `deliveryId`."""
    rows = NodeChange.objects.filter(node_id=node_id, id__gt=after).order_by("id")[:limit]
    return [{"deliveryId": row.id, **row.payload} for row in rows]


@dataclass(frozen=True)
class ChangeAnswer:
    """A change as answered: whether the node took it, and why not."""

    delivery_id: int
    accepted: bool
    reason: str


def node_change_answer(
    *, node_id: str, delivery_id: int, accepted: bool, reason: str, placement: dict[str, Any] | None = None
) -> ChangeAnswer:
    """Record the node's answer to one change; a refused "assign" releases the reservation (guard 6).

    The first answer stands: answering again (an agent that lost the server's
    reply) changes nothing and is answered with what was recorded. The
    `placement` of an accepted "assign" (`{cpus, numaNodes, gpuLocal}`) is kept
    on the reservation's allocation on the node, replacing what an earlier
    assign's answer said; on a "shorten" it is ignored (the node sends it with
    assigns only). A placement with a refusal is INVALID_INPUT.
    """
    if placement is not None and not accepted:
        raise InvalidInput.field("placement", "only an accepted assignment has a placement")
    with transaction.atomic():
        change = NodeChange.objects.select_for_update().filter(pk=delivery_id, node_id=node_id).first()
        if change is None:
            raise NotFound("no such change for this node")
        if change.answered_at is not None:
            return ChangeAnswer(delivery_id, bool(change.accepted), change.reason)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE reservations_nodechange SET answered_at = compute_now(), accepted = %s, reason = %s"
                " WHERE id = %s",
                [accepted, reason, delivery_id],
            )
        if placement is not None and change.kind == DeliveryKind.ASSIGN:
            Allocation.objects.filter(reservation_id=change.reservation_id, node_id=node_id).update(
                placement=dict(placement)
            )
        live = Reservation.objects.filter(pk=change.reservation_id, state__in=["scheduled", "active"])
        if not accepted and change.kind == DeliveryKind.ASSIGN and live.exists():
            refusal = AllocationFailed(
                device_uid="", holder="", message=reason or "the node refused the assignment"
            )
            assignment_refused.send(sender=Reservation, reservation_id=change.reservation_id, refusal=refusal)
    return ChangeAnswer(delivery_id, accepted, reason)


# How often a waiting long poll looks again (`node_changes_wait`).
POLL_SECONDS = 0.2


def node_changes_wait(*, node_id: str, after: int, wait_ms: int) -> list[dict[str, Any]]:
    """The node's changes after `after`; when there are none yet, wait up to `wait_ms` for one.

    The wait looks again every `POLL_SECONDS` (one indexed read), holding the
    request's thread: the simple transport, that works behind a transaction
    pooler, where LISTEN does not.
    """
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        changes = node_changes_after(node_id=node_id, after=after)
        remaining = deadline - time.monotonic()
        if changes or remaining <= 0:
            return changes
        time.sleep(min(POLL_SECONDS, remaining))
