"""What a node's agent says is wrong with a GPU: the GPU and its atoms become unhealthy.

A report's `health: {"healthy": false, "reason"}` marks the GPU and every atom
carved from it (MIG instances, slots) unhealthy, with an audit event naming the
reason. A later report that says nothing is wrong does not mark them healthy
again: a GPU that had a critical XID stays out until an operator clears it
(`devices/setHealth`), as an operator's own quarantine does.

With `"clears": true` the node holds the GPU back for a cause it will see go
away: a process using the GPU from outside every reservation, or processes of
an ended reservation that survived the kill. The GPU and its atoms are marked
the same way, and the device remembers the hold (`Device.node_hold`, its
reason). The first report of that node that does not call the GPU unhealthy
lifts the hold and makes them healthy again (`device.reported-healthy`). Only
a hold is lifted so: a device that was unhealthy already (an operator's
quarantine, a sticky report) is not held, and a sticky report of a held device
turns the hold into a sticky mark. An operator's `devices/setHealth` lifts the
hold too: the operator's word is the last one.

The report path runs inside `reservations.nodes.changes.nodes_changing`, so
both the marking and the lifting move the pools' rollups with them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connection

from core.services import audit_record
from inventory.reports import NodeReport


@dataclass(frozen=True)
class ReportedHealth:
    """What a batch of reports says of its GPUs' health, per device uid (a GPU and its atoms)."""

    # Unhealthy until an operator clears it: uid → reason.
    sticky: dict[str, str] = field(default_factory=dict)
    # Held back by the node until a report of it says otherwise: uid → reason.
    held: dict[str, str] = field(default_factory=dict)


def reported_health(reports: Iterable[NodeReport], parents: dict[str, list[str]]) -> ReportedHealth:
    """Each GPU a report calls unhealthy, and each atom under it (`parents`: its children), by kind."""
    out = ReportedHealth()
    for report in reports:
        for gpu in report.gpus:
            if gpu.unhealthy_reason is None:
                continue
            into = out.held if gpu.unhealthy_clears else out.sticky
            for uid in (gpu.uuid, *parents.get(gpu.uuid, ())):
                into[uid] = gpu.unhealthy_reason
    return out


def devices_mark_unhealthy(*, reasons: dict[str, str], actor: str) -> int:
    """Mark these devices unhealthy for good (one UPDATE); audit each that changed; return how many.

    A device the node held becomes a sticky one: its hold is dropped, so no later
    report makes it healthy again.
    """
    if not reasons:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE inventory_device SET healthy = false, node_hold = '', updated_at = now()"
            " WHERE uid = ANY(%s) AND (healthy OR node_hold <> '') AND vanished_at IS NULL"
            " RETURNING uid, node_id",
            [sorted(reasons)],
        )
        changed = cursor.fetchall()
    _audit(changed, reasons, actor=actor, action="device.reported-unhealthy")
    return len(changed)


def devices_hold(*, reasons: dict[str, str], actor: str) -> int:
    """The node holds these devices back: unhealthy, with the hold's reason; audit each newly held.

    Only a healthy device, or one held already (its reason refreshed), takes the
    hold: one unhealthy for another cause stays as it is, so lifting the hold
    later cannot undo an operator's quarantine or a sticky report.
    """
    if not reasons:
        return 0
    rows = json.dumps([{"uid": uid, "reason": reason} for uid, reason in sorted(reasons.items())])
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE inventory_device d SET healthy = false, node_hold = t.reason, updated_at = now()
              FROM json_to_recordset(%s::json) AS t(uid text, reason text), inventory_device old
             WHERE d.uid = t.uid AND old.id = d.id AND d.vanished_at IS NULL
               AND (d.healthy OR (d.node_hold <> '' AND d.node_hold <> t.reason))
            -- `old` is the row as the statement found it: whether it was healthy before.
            RETURNING d.uid, d.node_id, old.healthy
            """,
            [rows],
        )
        changed = cursor.fetchall()
    newly = [(uid, node_id) for uid, node_id, was_healthy in changed if was_healthy]
    _audit(newly, reasons, actor=actor, action="device.reported-unhealthy")
    return len(newly)


def devices_release_holds(*, node_ids: list[str], keep: Iterable[str], actor: str) -> int:
    """Lift the holds of these nodes' devices that their reports no longer hold (not in `keep`).

    Those devices become healthy again, each audited as `device.reported-healthy`
    with the hold's reason; returns how many.
    """
    if not node_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE inventory_device d SET healthy = true, node_hold = '', updated_at = now()
              FROM inventory_device old
             WHERE old.id = d.id AND d.node_id = ANY(%s) AND d.node_hold <> '' AND d.vanished_at IS NULL
               AND NOT (d.uid = ANY(%s))
            -- `old` is the row as the statement found it: the hold's reason.
            RETURNING d.uid, d.node_id, old.node_hold
            """,
            [node_ids, sorted(keep)],
        )
        lifted = cursor.fetchall()
    for uid, node_id, reason in lifted:
        audit_record(
            actor=actor,
            action="device.reported-healthy",
            subject_type="node",
            subject_id=node_id,
            reason=f"no longer held: {reason}",
            data={"device": uid},
        )
    return len(lifted)


def node_reports_health_apply(*, node_ids: list[str], health: ReportedHealth, actor: str) -> None:
    """A batch of reports' health: sticky marks, the node's holds, and the holds of `node_ids` lifted."""
    devices_mark_unhealthy(reasons=health.sticky, actor=actor)
    devices_hold(reasons=health.held, actor=actor)
    devices_release_holds(node_ids=node_ids, keep=[*health.sticky, *health.held], actor=actor)


def _audit(changed: list[tuple[str, str]], reasons: dict[str, str], *, actor: str, action: str) -> None:
    for uid, node_id in changed:
        audit_record(
            actor=actor,
            action=action,
            subject_type="node",
            subject_id=node_id,
            reason=reasons[uid],
            data={"device": uid},
        )
