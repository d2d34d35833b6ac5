"""`manage.py maintenance`: the operator plans, schedules, lists, shortens and cancels windows from the shell.

It calls the same services as `nodes/*Maintenance`: a window booked here refuses
a tenant's create into it over HTTP, moves the reservation inside it to the
other node, and is audited.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.management import CommandError
from rest_framework.test import APIClient

from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import MaintenanceWindow
from reservations.rollups.recount import rollup_rebuild
from tests.support.api import post_json, reservation_body
from tests.support.clock import HOUR_MS, now_ms
from tests.support.commands import run_command
from tests.support.placement import make_node


def stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


@pytest.mark.django_db
def test_plan_then_schedule_moves_the_reservation_inside_and_says_so(
    owner_client: APIClient, owned_pool: Pool
) -> None:
    first, second = make_node(owned_pool), make_node(owned_pool)
    rollup_rebuild(pool_id=owned_pool.pk)
    start = now_ms() + 2 * HOUR_MS
    status, created = post_json(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", "inside", gpus=4, start=start, duration=3600),
    )
    assert status == 201, created
    was = created["allocations"][0]["nodeId"]
    other = second.pk if was == first.pk else first.pk
    span = ("--from", stamp(start - HOUR_MS), "--to", str(start + 2 * HOUR_MS))

    planned = run_command("maintenance", "plan", "--nodes", was, *span)
    assert planned.startswith("dry run: nothing written")
    assert "reservations: 0 running, 1 moved, 0 stuck" in planned
    assert f"{created['id']} tenant acme" in planned and f"-> {other}" in planned
    assert "  acme: 0 / 1 / 0" in planned
    assert f"  {owned_pool.pk} gpu: 12 -> 4" in planned
    assert not MaintenanceWindow.objects.exists()

    hostname = Node.objects.get(pk=was).hostname
    scheduled = run_command("maintenance", "schedule", "--nodes", hostname, *span, "--reason", "firmware")
    assert scheduled.startswith("scheduled mw_") and "'firmware'" in scheduled
    assert "reservations: 0 running, 1 moved, 0 stuck" in scheduled and f"-> {other}" in scheduled
    window = MaintenanceWindow.objects.get()
    assert window.created_by.startswith("cli:")

    status, body = post_json(
        owner_client,
        "reservations/create",
        reservation_body(owned_pool, "acme", "into", gpus=8, start=start, duration=3600),
    )
    assert status == 409 and "maintenance window 'firmware'" in body["error"]["message"]


@pytest.mark.django_db
def test_list_update_and_cancel_are_audited(gpu_node: Node) -> None:
    start = now_ms() + 2 * HOUR_MS
    run_command(
        "maintenance", "schedule", "--nodes", gpu_node.pk, "--from", str(start), "--to", str(start + HOUR_MS),
        "--reason", "psu", "--actor", "alice",
    )  # fmt: skip
    window = MaintenanceWindow.objects.get()
    listed = run_command("maintenance", "list", "--node", "gpu-a-001")
    assert listed.startswith(f"{window.pk} scheduled 'psu' ") and gpu_node.pk in listed

    updated = run_command("maintenance", "update", window.pk, "--to", str(start + HOUR_MS // 2))
    assert updated.startswith(f"updated {window.pk} scheduled")
    cancelled = run_command("maintenance", "cancel", window.pk, "--reason", "postponed", "--actor", "alice")
    assert cancelled.startswith(f"cancelled {window.pk} cancelled")
    assert run_command("maintenance", "list") == "no maintenance window\n"
    assert window.pk in run_command("maintenance", "list", "--all")
    actions = AuditEvent.objects.filter(subject_id=window.pk).order_by("id").values_list("action", flat=True)
    assert list(actions) == ["maintenance.scheduled", "maintenance.shortened", "maintenance.cancelled"]


@pytest.mark.django_db
def test_refusals_are_command_errors_naming_the_cause(gpu_node: Node) -> None:
    start = now_ms() + 2 * HOUR_MS
    span = ("--from", str(start), "--to", str(start + HOUR_MS))
    run_command("maintenance", "schedule", "--nodes", gpu_node.pk, *span, "--reason", "one")
    with pytest.raises(CommandError, match="CONFLICT: nodes already held by maintenance window 'one'"):
        run_command("maintenance", "schedule", "--nodes", gpu_node.pk, *span, "--reason", "two")
    with pytest.raises(CommandError, match="no node with id or hostname 'nope'"):
        run_command("maintenance", "plan", "--nodes", "nope", *span)
    with pytest.raises(CommandError, match="neither ISO-8601"):
        run_command("maintenance", "plan", "--nodes", gpu_node.pk, "--from", "tuesday", "--to", "now")
    with pytest.raises(CommandError, match="give --nodes, or --pool"):
        run_command("maintenance", "plan", *span)
    assert MaintenanceWindow.objects.count() == 1
