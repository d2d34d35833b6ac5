"""The capacity commands: `rebuild_rollups`, `capacity` (JSON and tables) and its preview, the preview CLI."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from capacity.preview_cli import preview_command
from capacity.selectors.pools import capacity_summary, rollup_rows
from inventory.models import Pool
from reservations.rollups.recount import rollup_rebuild_all
from tests.support.commands import run_command
from tests.support.factories import NodeFactory, PoolFactory, TenantFactory, gpus
from tests.support.placement import make_node


@pytest.mark.django_db
def test_rebuild_rollups_once_and_for_one_pool() -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 2)
    out = io.StringIO()
    call_command("rebuild_rollups", stdout=out)
    assert f"rebuilt {Pool.objects.count()} pools" in out.getvalue()
    out = io.StringIO()
    call_command("rebuild_rollups", "--pool", pool.id, stdout=out)
    assert "gpu 0 allocated / 0 reserved / 2 allocatable" in out.getvalue()
    with pytest.raises(CommandError):
        call_command("rebuild_rollups", "--pool", "pool_00000000000000000000000000")


@pytest.mark.django_db
def test_capacity_command_prints_the_api_json_and_tables() -> None:
    acme = TenantFactory.create(id="acme")
    pool = PoolFactory.create(owner=acme, name="h100-east")
    gpus(NodeFactory.create(pool=pool), 4)
    rollup_rebuild_all()

    out = io.StringIO()
    call_command("capacity", "--tenant", "acme", "--json", stdout=out)
    assert json.loads(out.getvalue()) == capacity_summary(tenant_id="acme")

    out = io.StringIO()
    call_command("capacity", "--tenant", "acme", "--pool", pool.id, "--json", stdout=out)
    # Exactly what `capacity/byPool` answers, the at-risk count included.
    answer = json.loads(out.getvalue())
    assert answer == {"poolId": pool.id, "rows": rollup_rows(pool_id=pool.id), "atRiskReservations": 0}

    out = io.StringIO()
    call_command("capacity", "--tenant", "acme", stdout=out)
    assert "h100-east" in out.getvalue() and "H100" in out.getvalue()

    with pytest.raises(CommandError, match="not found"):
        call_command("capacity", "--tenant", "someone-else", "--pool", pool.id)


@pytest.mark.django_db
def test_capacity_preview_hands_over_to_the_preview_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    from capacity.management.commands import capacity as command

    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(command, "preview_command", lambda *args: calls.append(args))
    args = ["--tenant", "acme", "--preview", "--pool", "pool_x", "--gpus", "8", "--for", "1d"]
    call_command("capacity", *args, "--selector", "vramGiB >= 80", "--json")
    assert calls and calls[0][:6] == ("acme", "pool_x", 8, "1d", "vramGiB >= 80", True)


@pytest.mark.django_db
def test_preview_cli_prints_a_table_and_json(owned_pool: Pool) -> None:
    node = make_node(owned_pool, gpus=8, vram=80)
    make_node(owned_pool, gpus=8, vram=40)
    out = io.StringIO()
    preview_command(owned_pool.owner_id, owned_pool.id, 8, "1d", "vramGiB >= 80", False, out)
    text = out.getvalue()
    assert "fits: yes" in text and node.id in text
    out = io.StringIO()
    answer = preview_command(owned_pool.owner_id, owned_pool.id, 8, "1d", "vramGiB >= 80", True, out)
    assert [c["nodeId"] for c in answer["candidates"]] == [node.id]


@pytest.mark.django_db(transaction=True)
def test_capacity_for_an_unknown_tenant_exits_non_zero_as_a_subprocess() -> None:
    from tests.support.commands import child_env_on_this_database, run_python

    env = child_env_on_this_database()
    TenantFactory.create(id="acme")
    known = run_python("manage.py", "capacity", "--tenant", "acme", env=env, timeout=60)
    assert known.returncode == 0, known.stderr
    unknown = run_python("manage.py", "capacity", "--tenant", "nosuch", env=env, timeout=60)
    assert unknown.returncode == 1
    assert "tenant nosuch not found" in unknown.stderr
    assert unknown.stdout == ""


@pytest.mark.django_db
def test_the_pools_table_shows_allocatable_the_buckets_and_partitioned_pools_in_their_units() -> None:
    acme = TenantFactory.create(id="acme")
    whole = PoolFactory.create(owner=acme, name="h100-east", gpu_model="H100")
    gpus(NodeFactory.create(pool=whole), 4)
    gpus(NodeFactory.create(pool=whole, cordoned=True), 2)
    mig = PoolFactory.create(owner=acme, name="a100-mig", gpu_model="A100", sharing="mig")
    gpus(NodeFactory.create(pool=mig), 3, device_class="gpu.mig")
    rollup_rebuild_all()

    text = run_command("capacity", "--tenant", "acme")

    header = next(line for line in text.splitlines() if "allocatable" in line and "pool" in line)
    assert "not allocatable" in header
    h100 = next(line for line in text.splitlines() if line.startswith("│ h100-east"))
    assert [cell.strip() for cell in h100.split("│")[4:11]] == [
        "GPUs",
        "6",
        "4",
        "0",
        "0",
        "4",
        "2 maintenance",
    ]
    a100 = next(line for line in text.splitlines() if line.startswith("│ a100-mig"))
    assert "MIG instances" in a100 and " 3 " in a100
    # The by-model table names the partitioned pool's atoms instead of "A100 0 GPUs".
    assert "A100 MIG instances" in text


@pytest.mark.django_db
def test_the_preview_prints_its_times_in_iso_8601(owned_pool: Pool) -> None:
    make_node(owned_pool, gpus=2)
    out = io.StringIO()
    preview_command(owned_pool.owner_id, owned_pool.id, 1, "1h", None, False, out)
    first = out.getvalue().splitlines()[0]
    start = first.split("start: ")[1].split()[0]
    from datetime import datetime

    assert datetime.fromisoformat(start).tzinfo is not None
