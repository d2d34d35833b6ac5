"""Hostile fleet files: NUL, lone surrogates, trailing newlines, repeated keys; each refused whole."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from core.errors import InvalidInput
from core.models import Tenant
from fleets.spec import fleet_parse
from inventory.models import Node
from tests.support.commands import run_command
from tests.support.paths import ROOT
from tests.support.reports import gpu, report

NUL = "\x00"
LONE = "\ud800"


def small_fleet() -> dict[str, Any]:
    return {
        "tenants": [{"id": "acme", "name": "Acme"}],
        "pools": [{"name": "h100", "owner": "acme"}],
        "nodes": [
            {
                "hostname": "gpu-a-001",
                "pool": "h100",
                "labels": {"rack": "r1"},
                "taints": [{"key": "thermal", "value": "hot", "effect": "PreferNoSchedule", "reason": "fan"}],
                "report": report("gpu-a-001", [gpu(0)]),
            }
        ],
    }


def changed(path: str, value: Any) -> dict[str, Any]:
    """The small fleet with the value at `path` (`nodes.0.labels.rack`) replaced."""
    fleet = copy.deepcopy(small_fleet())
    *parents, last = path.split(".")
    target: Any = fleet
    for step in parents:
        target = target[int(step)] if isinstance(target, list) else target[step]
    target[last] = value
    return fleet


@pytest.mark.parametrize(
    ("fleet", "field"),
    [
        (changed("tenants.0.name", f"Acme{NUL}"), "tenants[0].name"),
        (changed("tenants.0.name", f"Acme{LONE}"), "tenants[0].name"),
        (changed("tenants.0.id", "acme\n"), "tenants[0].id"),
        (changed("pools.0.name", "h100\n"), "pools[0].name"),
        (changed("pools.0.gpuModel", f"H100{NUL}"), "pools[0].gpuModel"),
        (changed("nodes.0.hostname", "gpu-a-001\n"), "nodes[0].hostname"),
        (changed("nodes.0.labels", {"rack": f"r{NUL}"}), "nodes[0].labels.rack"),
        (changed("nodes.0.labels", {f"ra{LONE}ck": "r1"}), "nodes[0].labels.ra\\ud800ck"),
        (changed("nodes.0.taints.0.key", "thermal\n"), "nodes[0].taints[0].key"),
        (changed("nodes.0.taints.0.value", f"h{NUL}ot"), "nodes[0].taints[0].value"),
        (changed("nodes.0.taints.0.reason", LONE), "nodes[0].taints[0].reason"),
        (changed(f"nodes.0.x{NUL}", 1), "nodes[0].x\\u0000"),
        (changed("nodes.0.report.gpus.0.product", f"H100{NUL}"), "nodes[0].report.gpus[0].product"),
    ],
)
def test_a_fleet_with_a_bad_string_is_refused_naming_the_field(fleet: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        fleet_parse(data=fleet)
    fields = {d["field"] for d in caught.value.details}
    assert field in fields, caught.value.details
    json.dumps(caught.value.details, ensure_ascii=False).encode("utf-8")


def test_the_small_fleet_itself_is_accepted() -> None:
    assert [node.hostname for node in fleet_parse(data=small_fleet()).nodes] == ["gpu-a-001"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"tenants": [{"id": "acme", "id": "beta"}]}', "tenants[0].id: duplicate key"),
        ('{"tenants": [{"id": "acme", "name": "A\\u0000"}]}', "tenants[0].name: must not contain a NUL"),
        ('{"tenants": [{"id": "acme", "name": "\\udc00"}]}', "tenants[0].name: must not contain an unpaired"),
        ('{"tenants": [{"id": "acme", "name": "A"}]', "not valid JSON"),
    ],
)
def test_load_fleet_refuses_a_file_with_repeated_keys_or_bad_strings(
    tmp_path: Path, text: str, said: str
) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(text)
    with pytest.raises(CommandError) as refused:
        run_command("load_fleet", str(path))
    assert "nothing was loaded" in str(refused.value) and said in str(refused.value), str(refused.value)
    assert not Tenant.objects.exists() and not Node.objects.exists()


@pytest.mark.django_db
def test_load_fleet_still_loads_the_demo_fleet() -> None:
    ids = json.loads(run_command("load_fleet", str(ROOT / "fleets" / "demo.json")))
    assert ids["nodes"] and Node.objects.count() == len(ids["nodes"])
