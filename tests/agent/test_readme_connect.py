"""The README's "Connect real nodes" block runs as written against a live server, and the node joins.

Read out of README.md, run in bash with `set -euo pipefail`, like the "Try it"
block (`tests/guarantees/test_readme.py`); the shipped L40S snapshot stands in
for the GPUs.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from fleets.load import fleet_load
from inventory.models import Device, Node
from tests.support.commands import child_env_on_this_database
from tests.support.paths import ROOT


def connect_block() -> str:
    section = (ROOT / "README.md").read_text().split("## Connect real nodes", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README.md has no bash block under 'Connect real nodes'"
    return match.group(1)


@pytest.mark.django_db(transaction=True)
def test_the_connect_block_runs_as_written_and_the_host_joins(live_server: Any) -> None:
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    call_command("worker", "--once", stdout=io.StringIO())
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + connect_block()],
        cwd=ROOT,
        env=child_env_on_this_database(BASE_URL=live_server.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    node = Node.objects.get(hostname="gpu-l40s-001")
    assert node.agent and node.pool.name == "l40s-ts" and node.provision_state == "deployed"
    slots = Device.objects.filter(node=node, device_class="gpu.slot", vanished_at__isnull=True)
    assert slots.count() == 4 * node.pool.slots_per_gpu
    assert "reported, 0 assignment changes applied" in result.stdout
    assert result.stdout.rstrip().endswith("[]")  # `assignments`: nothing held yet


def work_block() -> str:
    section = (ROOT / "README.md").read_text().split("### Run work in a reservation", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README.md has no bash block under 'Run work in a reservation'"
    return match.group(1)


@pytest.mark.django_db(transaction=True)
def test_the_run_work_block_runs_as_written_inside_the_reservations_cgroup(live_server: Any) -> None:
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    call_command("worker", "--once", stdout=io.StringIO())
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + connect_block() + work_block() + 'echo "STATE=$STATE"\n'],
        cwd=ROOT,
        env=child_env_on_this_database(BASE_URL=live_server.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    out = result.stdout
    rsv = re.search(r"GPUs: (GPU-[0-9a-f-]+) in (rsv_[0-9a-z]+)", out)
    assert rsv, out
    # The placement the node reported: 8 CPUs of its GPU's NUMA node, local to it.
    placement = re.search(r"\{'cpus': \[([0-9, ]+)\], 'gpuLocal': (\w+), 'numaNodes': \[([0-9, ]*)\]\}", out)
    assert placement, out
    cpus = [int(c) for c in placement.group(1).split(",")]
    assert len(cpus) == 8 and placement.group(2) == "True" and len(placement.group(3).split(",")) == 1
    assert "refused: exit 6" in out
    state = Path(out.rsplit("STATE=", 1)[1].strip())
    # The end was enforced: the reservation's cgroup is gone from the root.
    assert not (state / "cgroup" / rsv.group(2)).exists()
