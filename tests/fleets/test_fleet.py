"""Fleet files: loading is idempotent and refuses a bad file whole; make_fleet is deterministic."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from core.models import Tenant
from fleets.load import fleet_load
from fleets.synthetic import fleet_generate
from inventory.models import Device, Node, NodeResource, Pool, Taint
from ledger.models import Offering, QuotaUsage
from tests.support.commands import run_command
from tests.support.paths import ROOT

DEMO = ROOT / "fleets" / "demo.json"


def snapshot() -> dict[str, Any]:
    """Every row the loader writes, without timestamps (a reload refreshes heartbeats)."""
    return {
        "tenants": list(Tenant.objects.order_by("id").values_list("id", "name")),
        "pools": list(
            Pool.objects.order_by("id").values_list(
                "id", "owner_id", "name", "gpu_model", "sharing", "slots_per_gpu", "archived_at"
            )
        ),
        "offerings": list(Offering.objects.order_by("id").values_list("id", "pool_id", "tenant_id")),
        "quotas": list(
            QuotaUsage.objects.order_by("id").values_list("id", "pool_id", "tenant_id", "resource", "max")
        ),
        "nodes": list(
            Node.objects.order_by("id").values_list(
                "id",
                "hostname",
                "pool_id",
                "role",
                "trust",
                "owner_id",
                "provision_state",
                "connectivity",
                "maintenance",
                "cordoned",
                "noschedule_taints",
                "converged_specs",
                "labels",
            )
        ),
        "taints": list(Taint.objects.order_by("id").values_list("id", "node_id", "key", "value", "effect")),
        "resources": list(
            NodeResource.objects.order_by("id").values_list(
                "id", "node_id", "resource", "allocatable", "ratio"
            )
        ),
        "devices": list(
            Device.objects.order_by("id").values_list(
                "id",
                "uid",
                "node_id",
                "device_class",
                "parent_id",
                "attributes",
                "healthy",
                "bookable",
                "vanished_at",
            )
        ),
    }


def load(path: Path) -> dict[str, Any]:
    return json.loads(run_command("load_fleet", str(path)))


@pytest.mark.django_db
def test_loading_the_demo_fleet_twice_leaves_the_same_rows() -> None:
    first = load(DEMO)
    before = snapshot()
    second = load(DEMO)
    assert second == first
    assert snapshot() == before
    demo = json.loads(DEMO.read_text())
    assert set(first["pools"]) == {f"{p['owner']}/{p['name']}" for p in demo["pools"]}
    assert set(first["nodes"]) == {n["hostname"] for n in demo["nodes"]}


@pytest.mark.django_db
def test_the_demo_fleet_has_every_non_schedulable_state() -> None:
    load(DEMO)
    nodes = Node.objects.all()
    assert nodes.filter(cordoned=True).exists()
    assert nodes.filter(maintenance=True).exists()
    assert nodes.filter(connectivity="disconnected").exists()
    assert nodes.exclude(provision_state__in=["adopted", "deployed"]).exists()
    assert nodes.filter(noschedule_taints__gt=0).exists()
    assert nodes.filter(trust="tenant-owned").exists()
    assert Pool.objects.filter(sharing="mig").exists() and Pool.objects.filter(sharing="timeslice").exists()
    assert QuotaUsage.objects.filter(tenant_id="beta", resource="gpu").exists()


@pytest.mark.django_db
def test_a_reload_keeps_quota_usage_and_counts_noschedule_taints() -> None:
    data = fleet_generate(nodes=60, seed=3)
    fleet_load(data=data)
    quota = QuotaUsage.objects.order_by("id").first()
    assert quota is not None
    QuotaUsage.objects.filter(pk=quota.pk).update(used=5)
    fleet_load(data=data)
    quota.refresh_from_db()
    assert quota.used == 5
    for node in Node.objects.all():
        assert node.noschedule_taints == node.taints.filter(effect="NoSchedule").count()
    assert Node.objects.filter(noschedule_taints__gt=0).exists()


@pytest.mark.django_db
def test_a_bad_fleet_file_is_refused_whole_naming_the_bad_field(tmp_path: Path) -> None:
    data = fleet_generate(nodes=10, seed=4)
    bad = copy.deepcopy(data)
    bad["nodes"][3]["report"]["gpus"][2]["memoryMiB"] = "lots"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(CommandError) as refused:
        call_command("load_fleet", str(path), stdout=io.StringIO())
    assert "nodes[3].report.gpus[2].memoryMiB" in str(refused.value)
    assert not Tenant.objects.exists() and not Node.objects.exists() and not Device.objects.exists()


def test_make_fleet_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    paths = [tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"]
    for path, seed in zip(paths, [7, 7, 8], strict=True):
        call_command(
            "make_fleet", "--nodes", "40", "--gpus-per-node", "8", "--seed", str(seed), "--out", str(path)
        )
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


@pytest.mark.django_db
def test_a_made_fleet_loads_with_mig_slot_and_whole_gpu_atoms(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    call_command(
        "make_fleet",
        "--nodes",
        "60",
        "--pools",
        "6",
        "--mig-share",
        "0.34",
        "--seed",
        "1",
        "--out",
        str(path),
    )
    ids = load(path)
    assert len(ids["nodes"]) == 60 and len(ids["pools"]) == 6
    classes = set(Device.objects.values_list("device_class", flat=True))
    assert {"gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node"} <= classes
    # A MIG parent or a slot parent is never an atom.
    assert not Device.objects.filter(device_class="gpu", bookable=True, children__isnull=False).exists()


def _rollup_counts() -> dict[tuple[str, str], tuple[int, ...]]:
    from reservations.models import PoolCapacityRollup

    return {
        (r.pool_id, r.resource): (r.allocatable, r.maintenance, r.unreachable, r.unhealthy, r.total)
        for r in PoolCapacityRollup.objects.all()
    }


@pytest.mark.django_db
def test_a_reload_that_cordons_a_known_node_moves_its_gpus_at_once() -> None:
    from reservations.rollups.recount import rollup_recount

    data = json.loads(DEMO.read_text())
    load(DEMO)
    run_command("rebuild_rollups")
    node = next(n for n in data["nodes"] if n["hostname"] == "gpu-a-001")
    pool_id = Node.objects.get(hostname="gpu-a-001").pool_id
    before = _rollup_counts()[(pool_id, "gpu")]
    node["cordoned"] = True
    fleet_load(data=data)
    after = _rollup_counts()[(pool_id, "gpu")]
    gpus = len(node["report"]["gpus"])
    # No rebuild ran: the reload itself moved the node's GPUs to `maintenance`.
    assert after[0] == before[0] - gpus
    assert after[1] == before[1] + gpus
    recounted = rollup_recount(pool_ids=[pool_id])[(pool_id, "gpu")]
    assert (recounted["allocatable"], recounted["maintenance"]) == after[:2]
