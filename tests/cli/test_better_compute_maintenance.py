"""`better-compute maintenance` end to end: an operator plans, schedules, lists, updates and cancels windows.

The CLI runs as a subprocess against the live server, with an operator's token
and no tenant (the maintenance methods act on the platform). The pool has one
eight-H100 node, so a tenant's future reservation inside a window cannot move:
the dry run shows it stuck, and the pool's lowest available drops from 7 to 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.services import token_issue
from inventory.models import Node, Pool
from tests.cli.runner import Cli
from tests.support.clock import HOUR_MS, now_ms

pytestmark = pytest.mark.django_db(transaction=True)

NO_TENANT: dict[str, str | None] = {"BETTER_COMPUTE_TENANT": None}


@pytest.fixture
def operator(cli: Cli, tmp_path: Path) -> Cli:
    _, secret = token_issue(tenant_id=None, role="operator", name="cli operator")
    return Cli(tmp_path, cli.url, secret, "acme")


def _reserve(cli: Cli, pool: Pool, start: int) -> str:
    result = cli("reserve", "--pool", pool.pk, "--gpus", "1", "--for", "1h", "--start", str(start), "--json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["id"])


def _span(start: int, end: int) -> tuple[str, ...]:
    return ("--from", str(start), "--to", str(end))


def test_plan_draws_each_group_per_node_the_tenants_and_the_pool_with_and_without(
    cli: Cli, operator: Cli, pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    rsv_id = _reserve(cli, pool, start)

    result = operator(
        "maintenance", "plan", "--nodes", gpu_node.pk, *_span(start, start + HOUR_MS), env=NO_TENANT
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "dry run, nothing written" in out
    assert f"{gpu_node.hostname} ({gpu_node.pk})" in out
    assert "running: would have to end (0)" in out
    assert "moved: BookingRepair moves them (0)" in out
    assert "stuck: cannot move, marked at risk (1)" in out
    assert rsv_id in out and "tenant acme" in out
    assert "running 0 · moved 0 · stuck 1" in out
    # The pool's lowest available: 7 of 8 with the node, none without it; a bar for each.
    pool_line = next(line for line in out.splitlines() if pool.pk in line)
    cells = [cell.strip() for cell in pool_line.split("│")[1:-1]]
    assert cells[:5] == [pool.pk, "gpu", "7", "0", "7"]
    assert "with    " in out and "without " in out and "░" in out

    # Nothing was written: the reservation is not at risk, and no window is listed.
    assert cli.json("get", rsv_id)["atRisk"] is None
    assert operator.json("maintenance", "list")["windows"] == []


def test_plan_by_pool_json_is_the_api_answer(operator: Cli, pool: Pool, gpu_node: Node) -> None:
    start = now_ms() + 2 * HOUR_MS
    answer = operator.json("maintenance", "plan", "--pool", pool.pk, *_span(start, start + HOUR_MS))
    assert [n["nodeId"] for n in answer["nodes"]] == [gpu_node.pk]
    assert answer["pools"] == [
        {"poolId": pool.pk, "resource": "gpu", "lowestAvailable": 8, "lowestAvailableWithout": 0}
    ]


def test_schedule_list_update_cancel(cli: Cli, operator: Cli, pool: Pool, gpu_node: Node) -> None:
    start = now_ms() + 2 * HOUR_MS
    rsv_id = _reserve(cli, pool, start)

    scheduled = operator(
        "maintenance",
        "schedule",
        "--nodes",
        gpu_node.pk,
        *_span(start, start + HOUR_MS),
        "--reason",
        "firmware",
    )
    assert scheduled.returncode == 0, scheduled.stderr
    assert "Scheduled window mw_" in scheduled.stdout and "'firmware'" in scheduled.stdout
    assert "stuck: cannot move, marked at risk (1)" in scheduled.stdout and rsv_id in scheduled.stdout
    window_id = scheduled.stdout.split("Scheduled window ")[1].split()[0]
    assert "maintenance window" in cli.json("get", rsv_id)["atRisk"]["reason"]

    listed = operator("maintenance", "list")
    assert listed.returncode == 0, listed.stderr
    assert window_id in listed.stdout and "firmware" in listed.stdout and gpu_node.pk in listed.stdout

    # Into the window: a tenant's create is refused, naming it.
    refused = cli("reserve", "--pool", pool.pk, "--gpus", "1", "--for", "30m", "--start", str(start))
    assert refused.returncode == 1
    assert "error: NO_CAPACITY: " in refused.stderr and "maintenance window 'firmware'" in refused.stderr

    updated: Any = operator.json("maintenance", "update", window_id, "--to", str(start + HOUR_MS // 2))
    assert updated["to"] == start + HOUR_MS // 2

    cancelled = operator("maintenance", "cancel", window_id, "--reason", "postponed")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"Cancelled window {window_id}" in cancelled.stdout and "cancelled" in cancelled.stdout
    assert operator.json("maintenance", "list")["windows"] == []
    assert [w["state"] for w in operator.json("maintenance", "list", "--all")["windows"]] == ["cancelled"]


def test_refusals_and_usage_errors_exit_as_every_command(
    cli: Cli, operator: Cli, pool: Pool, gpu_node: Node
) -> None:
    start = now_ms() + 2 * HOUR_MS
    span = _span(start, start + HOUR_MS)
    first = operator("maintenance", "schedule", "--nodes", gpu_node.pk, *span, "--reason", "one")
    assert first.returncode == 0, first.stderr
    # A second live window on the same node then: CONFLICT naming the first, exit 1.
    second = operator("maintenance", "schedule", "--nodes", gpu_node.pk, *span, "--reason", "two")
    assert second.returncode == 1
    assert second.stderr.startswith("error: CONFLICT: nodes already held by maintenance window 'one'")

    # A tenant's token is not an operator's.
    tenant = cli("maintenance", "list")
    assert tenant.returncode == 1 and tenant.stderr.startswith("error: ")

    both = operator("maintenance", "plan", "--nodes", gpu_node.pk, "--pool", pool.pk, *span)
    assert both.returncode == 2 and "give --nodes, or --pool" in both.stderr
    bad_time = operator("maintenance", "plan", "--nodes", gpu_node.pk, "--from", "tuesday", "--to", "now")
    assert bad_time.returncode == 2 and "'tuesday'" in bad_time.stderr
    missing = operator("maintenance", "update", "mw_00000000000000000000000000", "--to", str(start))
    assert missing.returncode == 1 and "error: NOT_FOUND: " in missing.stderr
