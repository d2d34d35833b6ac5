"""The worker's side of maintenance windows: nodes into maintenance at `from`, out at `to`.

Through the existing node events (`inventory.services.nodes.node_set_maintenance`
inside `reservations.nodes.changes.nodes_changing`), so the rollups move at once
(the atoms go to `maintenance`), BookingRepair is asked for, and the audit trail
says `node.maintenance.on` by `maintenance-window`. A node an operator had put in
maintenance before the window stays as the operator left it at the end. One
window per transaction, its row locked `FOR UPDATE SKIP LOCKED`, so two workers
never switch one window twice.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import DateTimeField, Func

from core.services import audit_record
from inventory.models import Node
from inventory.services import nodes as node_rows
from reservations.maintenance.windows import iso
from reservations.models import MaintenanceWindow, MaintenanceWindowState
from reservations.nodes.changes import nodes_changing

ACTOR = "maintenance-window"

# The next start of a scheduled window or end of an active one: the worker's deadline
# (`worker.deadlines`), one probe of the partial index `maintenance_window_live`.
NEXT_SWITCH_SQL = """(SELECT LEAST(min(w.starts_at) FILTER (WHERE w.state = 'scheduled'),
                           min(w.ends_at) FILTER (WHERE w.state = 'active'))
          FROM reservations_maintenancewindow w WHERE w.state IN ('scheduled', 'active'))"""


def _maintenance_reason(window: MaintenanceWindow) -> str:
    return f"maintenance window {window.reason!r} ({window.pk}) until {iso(window.ends_at)}"


def members_switch_on(window: MaintenanceWindow, *, actor: str = ACTOR) -> None:
    """Every node of the window into maintenance (the ones not in it already), in one transaction."""
    members = list(window.members.select_related("node").order_by("node_id"))
    with transaction.atomic(), nodes_changing(m.node_id for m in members):
        for member in members:
            node = Node.objects.get(pk=member.node_id)
            if node.maintenance:
                continue
            node_rows.node_set_maintenance(
                node=node, on=True, reason=_maintenance_reason(window), actor=actor
            )
            member.switched_on = True
            member.save(update_fields=["switched_on"])


def members_switch_off(window: MaintenanceWindow, *, actor: str = ACTOR) -> None:
    """The nodes the window put in maintenance out of it again (if still in it)."""
    members = list(window.members.filter(switched_on=True).order_by("node_id"))
    with transaction.atomic(), nodes_changing(m.node_id for m in members):
        for member in members:
            node = Node.objects.get(pk=member.node_id)
            if node.maintenance:
                node_rows.node_set_maintenance(node=node, on=False, reason=f"end of {window.pk}", actor=actor)
            member.switched_on = False
            member.save(update_fields=["switched_on"])


def _due(state: str, column: str) -> MaintenanceWindow | None:
    now = Func(function="compute_now", output_field=DateTimeField())
    return (
        MaintenanceWindow.objects.select_for_update(skip_locked=True)
        .filter(state=state, **{f"{column}__lte": now})
        .order_by(column, "id")
        .first()
    )


def _switch_one() -> bool:
    """Start or end one due window in its own transaction; False when none is due."""
    with transaction.atomic():
        window = _due(MaintenanceWindowState.SCHEDULED, "starts_at")
        if window is not None:
            members_switch_on(window)
            window.state = MaintenanceWindowState.ACTIVE
            window.save(update_fields=["state"])
            action = "maintenance.started"
        else:
            window = _due(MaintenanceWindowState.ACTIVE, "ends_at")
            if window is None:
                return False
            members_switch_off(window)
            window.state = MaintenanceWindowState.ENDED
            window.save(update_fields=["state"])
            action = "maintenance.ended"
        audit_record(
            actor=ACTOR,
            action=action,
            subject_type="maintenance-window",
            subject_id=window.pk,
            reason=window.reason,
            data={"from": iso(window.starts_at), "to": iso(window.ends_at)},
        )
    return True


def maintenance_windows_advance() -> int:
    """Switch every window whose start or end has passed; how many switches (the worker's job)."""
    switched = 0
    while _switch_one():
        switched += 1
    return switched
