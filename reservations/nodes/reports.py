"""Node reports with guard 2: a MIG or slot layout change books every atom of the GPU.

`inventory` writes what a report says (devices, scalars, heartbeat) and returns
the GPUs whose layout changed; this module books their atoms for the change
window in the same transaction, or refuses the whole report when one of the
old atoms carries a live or future booking. It is the one entry point for
applying reports: the `inventory/report` method, the fleet loader and tests.

All of it runs inside `reservations.nodes.changes.nodes_changing`: new
inventory, vanished devices, scalar and health changes, a reconnect and the
layout-change bookings (RUNNING bookings on counted atoms) move the rollups in
the same transaction, and a report that adds capacity wakes waiting creates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction

from core.errors import Conflict
from inventory.models import Device, Node
from inventory.reports import NodeReport, report_parse
from inventory.services.node_reports import LayoutChange, inventory_apply_reports, layout_window_seconds
from reservations.nodes.changes import nodes_changing


def _book_layout_change(device_ids: list[int], *, open_ended: bool) -> set[int]:
    """Guard 2: book atoms for a layout change; returns the ids that got a booking.

    `INSERT ... ON CONFLICT DO NOTHING` (no conflict target) honours the exclusion
    constraint, so an atom with a live or future booking is skipped, not raised on,
    and the caller compares counts. Open-ended (`[now, )`: unbounded, as `infinity`) so that a booking
    starting any time later also refuses the change; the caller cuts it afterwards.
    """
    if not device_ids:
        return set()
    upper = "NULL" if open_ended else "compute_now() + make_interval(secs => %s)"
    # Placeholders in text order: the window (when closed) comes before the ids.
    params: list[Any] = [] if open_ended else [layout_window_seconds()]
    params.append(device_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO device_bookings (device_id, allocation_id, purpose, during)
            SELECT d, NULL, 'layout-change', tstzrange(compute_now(), {upper})
              FROM unnest(%s::bigint[]) AS d
            ON CONFLICT DO NOTHING
            RETURNING device_id
            """,
            params,
        )
        return {row[0] for row in cursor.fetchall()}


def layout_changes_book(*, changes: list[LayoutChange]) -> None:
    """Book every old and new atom of the changed GPUs for the change window, or raise `Conflict`.

    The old atoms are first booked open-ended, so a booking starting any time
    later also refuses the change; then cut to the window, and the new atoms
    booked for it too. Raising rolls back the caller's transaction: nothing of
    the report is applied.
    """
    old = {device_id: change.gpu_uid for change in changes for device_id in change.old_atom_ids}
    if not old:
        return
    booked = _book_layout_change(list(old), open_ended=True)
    if len(booked) != len(old):
        refused = sorted({gpu for device_id, gpu in old.items() if device_id not in booked})
        raise Conflict(
            f"GPU {refused[0]} has a live or future booking; its MIG/slot layout cannot change now",
            [
                {"field": "gpus", "message": f"{gpu}: layout change refused, atoms are booked"}
                for gpu in refused
            ],
        )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE device_bookings
               SET during = tstzrange(lower(during), compute_now() + make_interval(secs => %s))
             WHERE purpose = 'layout-change' AND device_id = ANY(%s) AND upper_inf(during)
            """,
            [layout_window_seconds(), list(booked)],
        )
    # New atoms are fresh rows or came back from vanished; ON CONFLICT DO NOTHING
    # leaves any booking they already carry in place.
    new_atoms = [
        device_id for change in changes for device_id in change.new_atom_ids if device_id not in booked
    ]
    _book_layout_change(new_atoms, open_ended=False)


def node_reports_apply(
    *,
    items: Iterable[tuple[Node, NodeReport]],
    actor: str,
    ratios: dict[str, dict[str, float]] | None = None,
    connect: bool = True,
) -> None:
    """Apply parsed reports for several nodes in one transaction, layout bookings and rollups included.

    The nodes' rollup contributions are counted once before and once after the
    whole batch (two statements, whatever its size), so the fleet loader's
    thousands of reports stay cheap.
    """
    items = list(items)
    with transaction.atomic(), nodes_changing(node.pk for node, _ in items):
        applied = inventory_apply_reports(items=items, actor=actor, ratios=ratios, connect=connect)
        layout_changes_book(changes=applied.layout_changes)


def node_report_apply(*, node: Node, report: dict[str, Any], actor: str) -> list[Device]:
    """Apply one node's report in one transaction and return the node's present devices.

    The report is validated first (`InvalidInput` naming every bad field); a MIG or
    slot layout change whose atoms are booked is refused with `Conflict`. Either
    way nothing of it is applied.
    """
    parsed = report_parse(data=report)
    with transaction.atomic():
        node_reports_apply(items=[(node, parsed)], actor=actor)
        return list(Device.objects.filter(node=node, vanished_at__isnull=True).order_by("uid"))
