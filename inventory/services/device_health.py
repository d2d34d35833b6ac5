"""What a node's agent says is wrong with a GPU: the GPU and its atoms become unhealthy.

A report's `health: {"healthy": false, "reason"}` marks the GPU and every atom
carved from it (MIG instances, slots) unhealthy, with an audit event naming the
reason. A later report that says nothing is wrong does not mark them healthy
again: a GPU that had a critical XID stays out until an operator clears it
(`devices/setHealth`), as an operator's own quarantine does.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from core.services import audit_record
from inventory.reports import NodeReport


def reported_unhealthy(reports: Iterable[NodeReport], parents: dict[str, list[str]]) -> dict[str, str]:
    """Uid → reason for each GPU a report calls unhealthy and each atom under it (`parents`: its children)."""
    out: dict[str, str] = {}
    for report in reports:
        for gpu in report.gpus:
            if gpu.unhealthy_reason is not None:
                for uid in (gpu.uuid, *parents.get(gpu.uuid, ())):
                    out[uid] = gpu.unhealthy_reason
    return out


def devices_mark_unhealthy(*, reasons: dict[str, str], actor: str) -> int:
    """Mark these devices unhealthy (one UPDATE); audit each that was healthy; return how many changed."""
    if not reasons:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE inventory_device SET healthy = false, updated_at = now()"
            " WHERE uid = ANY(%s) AND healthy AND vanished_at IS NULL RETURNING uid, node_id",
            [sorted(reasons)],
        )
        changed = cursor.fetchall()
    for uid, node_id in changed:
        audit_record(
            actor=actor,
            action="device.reported-unhealthy",
            subject_type="node",
            subject_id=node_id,
            reason=reasons[uid],
            data={"device": uid},
        )
    return len(changed)
