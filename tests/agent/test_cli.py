"""`better-compute-agent` as an operator runs it: a subprocess, its output and its exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from better_compute_agent.discovery.report import gpu_devices
from better_compute_agent.discovery.snapshot import SnapshotSource
from better_compute_agent.store import Store
from inventory.reports import report_parse
from tests.support.paths import ROOT

SNAPSHOTS = ROOT / "better_compute_agent" / "snapshots"
A100 = SNAPSHOTS / "a100-mig.json"


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE")}
    return subprocess.run(
        [sys.executable, "-m", "better_compute_agent", *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_show_prints_the_report_the_service_takes() -> None:
    result = agent("--snapshot", str(A100), "show")
    assert result.returncode == 0, result.stderr
    parsed = report_parse(data=json.loads(result.stdout))
    assert len(parsed.gpus) == 8 and all(len(gpu.mig_instances) == 7 for gpu in parsed.gpus)


def test_a_host_without_nvml_gets_one_line_naming_the_snapshot_flag() -> None:
    result = agent("show")
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "--snapshot" in result.stderr
    assert "Traceback" not in result.stderr


def test_snapshot_writes_what_it_read(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    result = agent("--snapshot", str(A100), "snapshot", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == json.loads(A100.read_text())


def test_talking_to_the_service_needs_a_token(tmp_path: Path) -> None:
    result = agent("--snapshot", str(A100), "--state-dir", str(tmp_path), "once")
    assert result.returncode == 2
    assert "BETTER_COMPUTE_TOKEN" in result.stderr and "issue_token" in result.stderr


def test_env_names_the_booked_mig_instances_for_a_prolog(tmp_path: Path) -> None:
    devices = gpu_devices(SnapshotSource(A100).read())
    mig_atoms = sorted(uid for uid in devices if "/gi" in uid)[:2]
    with Store(tmp_path / "store.json") as store:
        change = {
            "deliveryId": 1,
            "kind": "assign",
            "reservationId": "rsv_01k0000000000000000000000a",
            "atoms": mig_atoms,
            "start": 0,
            "end": 2**46,
            "resources": {},
            "profile": None,
        }
        assert store.apply(change, capacity={}).accepted
    result = agent(
        "--snapshot", str(A100), "--state-dir", str(tmp_path), "env", "rsv_01k0000000000000000000000a"
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines())
    expected = ",".join(devices[uid].env_uuid for uid in mig_atoms)
    assert lines == {"CUDA_VISIBLE_DEVICES": expected, "NVIDIA_VISIBLE_DEVICES": expected}
    assert all(uuid.startswith("MIG-") for uuid in expected.split(","))
    listed = json.loads(agent("--state-dir", str(tmp_path), "assignments").stdout)
    assert [h["reservationId"] for h in listed] == ["rsv_01k0000000000000000000000a"] and listed[0]["live"]
    missing = agent(
        "--snapshot", str(A100), "--state-dir", str(tmp_path), "env", "rsv_01k0000000000000000000000b"
    )
    assert missing.returncode == 1 and "not held" in missing.stderr
