"""Host discovery: the live backend over a fake NVML and a fake /proc and /sys, snapshot files, and
the node report and device map made from a snapshot, checked against the server's own parser."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from better_compute_agent.discovery.nvml import NvmlSource
from better_compute_agent.discovery.report import CONTROL_DEVICES, gpu_devices, report_from_snapshot
from better_compute_agent.discovery.snapshot import SnapshotSource, snapshot_problem, snapshot_write
from better_compute_agent.discovery.source import DiscoveryError, Snapshot
from inventory.reports import NodeReport, report_parse, report_schema
from tests.agent.fake_pynvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeMig,
    FakeNvml,
    a100_mig,
    h100,
)

SNAPSHOTS = Path(__file__).resolve().parents[2] / "better_compute_agent" / "snapshots"
HOSTNAME = "gpu-test-001"


def parsed(report: dict[str, Any]) -> NodeReport:
    """The report as the server takes it: its JSON Schema and its strict parser both accept it."""
    jsonschema.validate(report, report_schema())
    return report_parse(data=report)


def shipped(name: str) -> Snapshot:
    return SnapshotSource(SNAPSHOTS / f"{name}.json").read()


# --- a fake host tree -----------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _pci_device(sys_root: Path, address: str, numa: int) -> Path:
    device = sys_root / "devices" / "pci0000:00" / address
    _write(device / "numa_node", f"{numa}\n")
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / address).symlink_to(device)
    return device


def _interface(
    sys_root: Path, name: str, *, address: str | None, speed: str, numa: int, vfs: int | None
) -> None:
    iface = sys_root / "class" / "net" / name
    _write(iface / "speed", speed)
    if address is None:
        return
    device = _pci_device(sys_root, address, numa)
    (iface / "device").symlink_to(device)
    if vfs is None:
        return
    _write(device / "sriov_numvfs", f"{vfs}\n")
    domain_bus, _, _ = address.rpartition(":")
    for k in range(vfs):
        function = k + 1
        vf = _pci_device(sys_root, f"{domain_bus}:{function // 8:02x}.{function % 8}", numa)
        (device / f"virtfn{k}").symlink_to(Path("..") / vf.name)


def _disk(sys_root: Path, name: str, sectors: int, *, rotational: int = 0, removable: int = 0) -> None:
    block = sys_root / "block" / name
    _write(block / "size", f"{sectors}\n")
    _write(block / "removable", f"{removable}\n")
    _write(block / "queue" / "rotational", f"{rotational}\n")


def _mig_minors(gpus: int) -> str:
    """The driver's table of MIG capability device minors, as /proc/driver/nvidia-caps/mig-minors has it."""
    lines, minor = ["config 1", "monitor 2"], 3
    for gpu in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A host's /proc and /sys: 8 CPUs, 2 TiB, 1600 hugepages, two GPUs' PCI devices, NICs and disks."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    _write(proc / "sys" / "kernel" / "hostname", f"{HOSTNAME}\n")
    _write(proc / "cpuinfo", "".join(f"processor\t: {i}\nmodel name\t: Xeon\n\n" for i in range(8)))
    _write(proc / "meminfo", "MemTotal:       2113261056 kB\nMemFree:        2000000000 kB\n")
    _write(proc / "driver" / "nvidia-caps" / "mig-minors", _mig_minors(2))
    _write(sys_root / "kernel" / "mm" / "hugepages" / "hugepages-1048576kB" / "nr_hugepages", "1600\n")
    _pci_device(sys_root, "0000:1b:00.0", 0)
    _pci_device(sys_root, "0000:43:00.0", 1)
    _pci_device(sys_root, "0000:07:00.0", -1)
    _pci_device(sys_root, "0000:0f:00.0", 3)
    _interface(sys_root, "lo", address=None, speed="", numa=0, vfs=None)
    _interface(sys_root, "eno1", address="0000:02:00.0", speed="1000\n", numa=0, vfs=None)
    _interface(sys_root, "enp24s0np0", address="0000:18:00.0", speed="400000\n", numa=0, vfs=11)
    _interface(sys_root, "enp154s0np0", address="0000:9a:00.0", speed="-1\n", numa=1, vfs=2)
    _disk(sys_root, "nvme0n1", 7501476528)
    _disk(sys_root, "sda", 3907029168, rotational=1)
    _disk(sys_root, "nvme1n1", 0)
    _disk(sys_root, "loop0", 1000000)
    _disk(sys_root, "dm-0", 1000000)
    _disk(sys_root, "md0", 1000000)
    _disk(sys_root, "sr0", 2097152, rotational=1, removable=1)
    return {"proc": proc, "sys": sys_root}


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """`nvml([gpus...])` installs a fake pynvml with those GPUs for the backend to import."""

    def install(gpus: list[FakeGpu], **kwargs: Any) -> FakeNvml:
        fake = FakeNvml(gpus, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def live(host: dict[str, Path]) -> NvmlSource:
    return NvmlSource(proc=host["proc"], sys=host["sys"], dev=Path("/dev"))


# --- shipped snapshots ----------------------------------------------------------------------------


def test_h100_snapshot_is_eight_nvlinked_gpus_and_eight_sriov_nics() -> None:
    report = parsed(report_from_snapshot(shipped("h100-8gpu-sriov")))
    assert [g.product for g in report.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert {g.model for g in report.gpus} == {"H100"}
    assert {g.memory_mib for g in report.gpus} == {81559}
    assert len({g.nvlink_domain for g in report.gpus}) == 1 and report.gpus[0].nvlink_domain
    assert [g.numa_node for g in report.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(report.nics) == 8 and all(n.vfs and n.link_gbps == 400 for n in report.nics)
    assert report.resources["diskGiB"] == sum(d.size_gib for d in report.disks) > 0
    assert report.resources["hugepages1Gi"] > 0 and report.resources["vcpu"] == 224


def test_a100_snapshot_is_eight_mig_gpus_of_seven_1g_10gb_instances() -> None:
    report = parsed(report_from_snapshot(shipped("a100-mig")))
    assert len(report.gpus) == 8 and all(g.mig_enabled for g in report.gpus)
    instances = [m for g in report.gpus for m in g.mig_instances]
    assert len(instances) == 56
    assert {m.profile for m in instances} == {"1g.10gb"}
    assert all(len(g.mig_instances) == 7 for g in report.gpus)


def test_l40s_snapshot_is_four_pcie_gpus_without_nvlink() -> None:
    report = parsed(report_from_snapshot(shipped("l40s-4gpu")))
    assert [g.model for g in report.gpus] == ["L40S"] * 4
    assert all(g.nvlink_domain is None and not g.mig_enabled for g in report.gpus)
    assert {d.media for d in report.disks} == {"nvme", "ssd"}


def test_gpu_devices_of_the_mig_snapshot_are_mig_uuids_with_their_capability_devices() -> None:
    snapshot = shipped("a100-mig")
    devices = gpu_devices(snapshot)
    assert len(devices) == 56
    first = snapshot["gpus"][0]
    device = devices[f"{first['uuid']}/gi7/ci0"]
    assert device.uid == f"{first['uuid']}/gi7/ci0"
    assert device.env_uuid.startswith("MIG-") and device.env_uuid != first["uuid"]
    node, gi_cap, ci_cap = device.device_nodes
    assert node == "/dev/nvidia0"
    assert gi_cap.startswith("/dev/nvidia-caps/nvidia-cap") and ci_cap.startswith(
        "/dev/nvidia-caps/nvidia-cap"
    )
    assert gi_cap != ci_cap
    caps = [path for d in devices.values() for path in d.device_nodes[1:]]
    assert len(caps) == len(set(caps)) == 112  # no two instances share a capability device
    assert not any(gpu["uuid"] in devices for gpu in snapshot["gpus"])  # a MIG parent is not bookable


def test_gpu_devices_of_the_h100_snapshot_are_the_whole_gpus_device_nodes() -> None:
    snapshot = shipped("h100-8gpu-sriov")
    devices = gpu_devices(snapshot)
    assert sorted(d.device_nodes for d in devices.values()) == [(f"/dev/nvidia{i}",) for i in range(8)]
    assert all(uid == d.env_uuid and uid.startswith("GPU-") for uid, d in devices.items())
    assert set(devices) == {g["uuid"] for g in snapshot["gpus"]}
    assert "/dev/nvidiactl" in CONTROL_DEVICES


# --- the live backend over a fake NVML ------------------------------------------------------------


def test_live_read_of_whole_gpus_and_the_host(host: dict[str, Path], nvml: Callable[..., FakeNvml]) -> None:
    nvml([h100(0), h100(1)])
    snapshot = live(host).read()
    assert snapshot_problem(snapshot) is None
    assert snapshot["hostname"] == HOSTNAME and snapshot["driverVersion"] == "550.90.07"
    assert snapshot["host"] == {"vcpu": 8, "memoryGiB": 2015, "hugepages1Gi": 1600}
    gpu0, gpu1 = snapshot["gpus"]
    assert (gpu0["uuid"], gpu0["name"], gpu0["memoryMiB"]) == (h100(0).uuid, "NVIDIA H100 80GB HBM3", 81559)
    assert (gpu0["pciBusId"], gpu0["minor"], gpu0["numaNode"]) == ("00000000:1B:00.0", 0, 0)
    assert gpu1["numaNode"] == 1
    assert gpu0["nvlinkDomain"] == gpu1["nvlinkDomain"] == f"nvl-{HOSTNAME}"  # through the NVSwitches
    assert gpu0["mig"] == {"enabled": False, "instances": []}

    nics = {n["pf"]: n for n in snapshot["nics"]}
    assert set(nics) == {"enp24s0np0", "enp154s0np0"}  # lo and eno1 have no SR-IOV
    fast = nics["enp24s0np0"]
    assert (fast["pciAddress"], fast["linkGbps"], fast["numaNode"]) == ("0000:18:00.0", 400, 0)
    # In virtfn order (virtfn10 after virtfn9), each VF at the next function number.
    assert fast["vfs"] == [f"0000:18:{n // 8:02x}.{n % 8}" for n in range(1, 12)]
    assert nics["enp154s0np0"]["linkGbps"] is None  # the link is down

    assert snapshot["disks"] == [
        {"id": "nvme0n1", "sizeGiB": 3576, "media": "nvme"},
        {"id": "sda", "sizeGiB": 1863, "media": "hdd"},
    ]
    report = parsed(report_from_snapshot(snapshot))
    assert report.resources == {"vcpu": 8, "memoryGiB": 2015, "diskGiB": 3576 + 1863, "hugepages1Gi": 1600}
    assert [g.uuid for g in report.gpus] == [h100(0).uuid, h100(1).uuid]


def test_nvlink_domains_follow_the_links(host: dict[str, Path], nvml: Callable[..., FakeNvml]) -> None:
    pair = [h100(0, nvswitch=False), h100(1, nvswitch=False)]
    pair[0].nvlinks = [pair[1].bus_id] * 4  # an NVLink bridge between the two
    pair[1].nvlinks = [pair[0].bus_id] * 4
    alone = h100(2, nvswitch=False)
    switched = h100(3)
    switched.failing = {"nvmlDeviceGetNvLinkRemotePciInfo": NVML_ERROR_UNKNOWN}  # the far end has no name
    nvml([*pair, alone, switched])
    gpus = live(host).read()["gpus"]
    assert gpus[0]["nvlinkDomain"] == gpus[1]["nvlinkDomain"] == f"nvl-{HOSTNAME}"
    assert gpus[2]["nvlinkDomain"] is None
    assert gpus[3]["nvlinkDomain"] == f"nvl-{HOSTNAME}-1"
    assert gpus[3]["health"]["queryErrors"] == []  # topology, not health


def test_live_read_of_mig_instances(host: dict[str, Path], nvml: Callable[..., FakeNvml]) -> None:
    gpu = a100_mig(1, [(2, 0, "3g.40gb", 40192), (1, 0, "3g.40gb", 40192), (1, 1, "1c.3g.40gb", 40192)])
    # The driver's name of this one leaves the profile out: it is rebuilt from the slices.
    gpu.migs.append(
        FakeMig(5, 0, "2g.20gb", 19968, "MIG-00000000-0000-4000-8000-000000000520", name_has_profile=False)
    )
    nvml([a100_mig(0, []), gpu])
    snapshot = live(host).read()
    assert snapshot["gpus"][0]["numaNode"] is None  # numa_node -1: the platform has none
    mig = snapshot["gpus"][1]["mig"]
    assert mig["enabled"] is True
    assert [(m["gi"], m["ci"], m["profile"]) for m in mig["instances"]] == [
        (1, 0, "3g.40gb"),
        (1, 1, "1c.3g.40gb"),
        (2, 0, "3g.40gb"),
        (5, 0, "2g.20gb"),
    ]
    first = mig["instances"][0]
    # gpu1's table starts at 3 + 135; gi1 is 9 further on, its ci0 one after that.
    assert first["giCapDevice"] == "/dev/nvidia-caps/nvidia-cap147"
    assert first["ciCapDevice"] == "/dev/nvidia-caps/nvidia-cap148"
    assert first["uuid"] == gpu.migs[1].uuid and first["memoryMiB"] == 40192

    report = parsed(report_from_snapshot(snapshot))
    assert [(m.gi, m.ci) for m in report.gpus[1].mig_instances] == [(1, 0), (1, 1), (2, 0), (5, 0)]
    devices = gpu_devices(snapshot)
    assert devices[f"{gpu.uuid}/gi1/ci1"].env_uuid == gpu.migs[2].uuid
    assert devices[f"{gpu.uuid}/gi1/ci1"].device_nodes == (
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap147",
        "/dev/nvidia-caps/nvidia-cap149",
    )


def test_a_gpu_whose_queries_fail_is_reported_unhealthy_and_the_others_are_not(
    host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    broken = h100(1)
    broken.failing = {
        "nvmlDeviceGetRemappedRows": NVML_ERROR_UNKNOWN,
        "nvmlDeviceGetMigMode": NVML_ERROR_UNKNOWN,
    }
    nvml([h100(0), broken])
    snapshot = live(host).read()
    assert snapshot["gpus"][1]["health"]["queryErrors"] == [
        "nvmlDeviceGetMigMode: Unknown Error",
        "nvmlDeviceGetRemappedRows: Unknown Error",
    ]
    report = report_from_snapshot(snapshot)
    assert "health" not in report["gpus"][0]
    health = report["gpus"][1]["health"]
    assert health["healthy"] is False
    assert health["reason"] == "NVML query failed: nvmlDeviceGetMigMode: Unknown Error (and 1 more)"
    parsed(report)


def test_a_query_the_gpu_or_driver_lacks_is_no_fault(
    host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    old_driver = h100(0)
    old_driver.failing = {"nvmlDeviceGetRemappedRows": NVML_ERROR_FUNCTION_NOT_FOUND}
    nvml([old_driver])  # and Hopper answers "not supported" for retired pages
    snapshot = live(host).read()
    assert snapshot["gpus"][0]["health"]["queryErrors"] == []
    assert "health" not in report_from_snapshot(snapshot)["gpus"][0]


def test_a_lost_gpu_stays_in_the_snapshot_and_leaves_the_report(
    host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    lost = h100(1)
    lost.lost = True
    nvml([h100(0), lost])
    snapshot = live(host).read()
    assert snapshot["gpus"][1]["uuid"] is None
    assert snapshot["gpus"][1]["health"]["queryErrors"] == ["nvmlDeviceGetHandleByIndex: GPU is lost"]
    report = parsed(report_from_snapshot(snapshot))
    assert [g.uuid for g in report.gpus] == [h100(0).uuid]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("retired_pending", "retired memory pages pending (the GPU needs a reset)"),
        ("remap_failure", "memory row remapping failed (the GPU needs service)"),
    ],
)
def test_memory_faults_make_a_gpu_unhealthy(
    host: dict[str, Path], nvml: Callable[..., FakeNvml], fault: str, reason: str
) -> None:
    sick = h100(0)
    sick.retired_pages_supported = True
    setattr(sick, fault, True)
    nvml([sick, h100(1)])
    report = report_from_snapshot(live(host).read())
    assert report["gpus"][0]["health"] == {"healthy": False, "reason": reason}
    assert "health" not in report["gpus"][1]
    parsed(report)


def test_a_critical_xid_makes_its_gpu_unhealthy_from_the_next_read_on(
    host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    fake = nvml([h100(0), h100(1)])
    source = live(host)
    assert all("health" not in g for g in report_from_snapshot(source.read())["gpus"])
    fake.xid(0, 79)  # fallen off the bus
    fake.xid(1, 13)  # an application's fault: the GPU is fine
    second = report_from_snapshot(source.read())
    assert second["gpus"][0]["health"] == {"healthy": False, "reason": "critical XID 79 seen"}
    assert "health" not in second["gpus"][1]
    third = report_from_snapshot(source.read())
    assert third["gpus"][0]["health"]["reason"] == "critical XID 79 seen"  # until the agent restarts
    assert fake.initialised == 1  # NVML initialised once for the source's life
    source.close()
    assert fake.initialised == 0


def test_without_the_pynvml_module_the_error_is_one_line_naming_snapshot(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(DiscoveryError) as caught:
        live(host).read()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("NVML is not available on this host")
    assert "--snapshot FILE" in message
    assert caught.value.__suppress_context__  # no chained traceback behind it


def test_without_the_nvml_library_the_error_is_one_line_naming_snapshot(
    host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    nvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(DiscoveryError) as caught:
        live(host).read()
    assert str(caught.value) == (
        "NVML is not available on this host (NVML Shared Library Not Found); "
        "run with --snapshot FILE to report from a snapshot file instead"
    )


def test_the_agent_package_imports_neither_pynvml_nor_django_nor_the_apps() -> None:
    code = (
        "import sys\n"
        "import better_compute_agent.discovery.nvml, better_compute_agent.discovery.report\n"
        "import better_compute_agent.discovery.snapshot\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted({'pynvml', 'django', 'core', 'inventory', 'better_compute'} & top))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- snapshot files -------------------------------------------------------------------------------


def test_a_written_snapshot_reads_back_equal(
    tmp_path: Path, host: dict[str, Path], nvml: Callable[..., FakeNvml]
) -> None:
    nvml([h100(0), a100_mig(1, [(1, 0, "7g.80gb", 80896)])])
    snapshot = live(host).read()
    path = tmp_path / "host.json"
    snapshot_write(snapshot, path)
    assert SnapshotSource(path).read() == snapshot
    text = path.read_text()
    assert text == json.dumps(snapshot, indent=2, sort_keys=True) + "\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
        ("[]", "snapshot: must be an object"),
        (
            '{"snapshotVersion": 2, "hostname": "h", "host": {}, "gpus": []}',
            "snapshotVersion: 2 is not supported",
        ),
        ('{"snapshotVersion": 1, "hostname": "h", "gpus": []}', "host: required"),
    ],
)
def test_a_missing_or_malformed_snapshot_is_one_line(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "host.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DiscoveryError) as caught:
        SnapshotSource(path).read()
    assert str(caught.value).startswith(f"snapshot {path}: {problem}")
    assert "\n" not in str(caught.value)


def test_a_snapshot_with_a_wrong_type_names_the_field(tmp_path: Path) -> None:
    snapshot = shipped("a100-mig")
    snapshot["gpus"][3]["mig"]["instances"][2]["memoryMiB"] = "9.5 GiB"
    path = tmp_path / "host.json"
    snapshot_write(snapshot, path)
    with pytest.raises(
        DiscoveryError, match=r"gpus\[3\]\.mig\.instances\[2\]\.memoryMiB: must be an integer$"
    ):
        SnapshotSource(path).read()
