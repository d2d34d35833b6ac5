"""The CDI spec the node keeps: one device per live reservation, with its GPUs and nothing else."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from better_compute_agent import cdi
from better_compute_agent.cdi import cdi_spec, cdi_write, visible_devices_env
from better_compute_agent.store import Holding, Store

HOUR = 3_600_000
T0 = 1_767_225_600_000
CONTROL = [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}]


@dataclass(frozen=True)
class Gpu:
    """Shaped like discovery's GpuDevice; the spec takes anything with these fields."""

    uid: str
    env_uuid: str
    device_nodes: tuple[str, ...]


DEVICES = {
    gpu.uid: gpu
    for gpu in (
        Gpu("gpu-0", "GPU-aaaa", ("/dev/nvidia0",)),
        Gpu("gpu-1", "GPU-bbbb", ("/dev/nvidia1", "/dev/nvidiactl")),
        # Two MIG devices of GPU 2: one device file, a capability file each.
        Gpu("mig-2-1", "MIG-cccc", ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap21")),
        Gpu("mig-2-2", "MIG-dddd", ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30")),
    )
}


def holding(reservation_id: str, *atoms: str, start: int = T0, end: int = T0 + HOUR) -> Holding:
    return Holding(reservation_id, atoms, start, end, {}, None, 1)


def test_the_spec_has_one_device_per_reservation_with_its_gpus() -> None:
    spec = cdi_spec(
        [
            holding("rsv_b", "mig-2-2", "nic-vf-3", "mig-2-1"),
            holding("rsv_a", "gpu-1", "gpu-0", "node"),
            holding("rsv_nogpu", "nic-vf-1", "disk-0"),
        ],
        DEVICES,
    )

    assert spec == {
        "cdiVersion": "0.6.0",
        "kind": "better-compute.io/reservation",
        "devices": [
            {
                "name": "rsv_a",
                "containerEdits": {
                    "env": [
                        "NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb",
                        "CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb",
                    ],
                    # The control device a GPU lists is left to the spec-wide edits.
                    "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}],
                },
            },
            {
                "name": "rsv_b",
                "containerEdits": {
                    "env": [
                        "NVIDIA_VISIBLE_DEVICES=MIG-cccc,MIG-dddd",
                        "CUDA_VISIBLE_DEVICES=MIG-cccc,MIG-dddd",
                    ],
                    "deviceNodes": [
                        {"path": "/dev/nvidia2"},
                        {"path": "/dev/nvidia-caps/nvidia-cap21"},
                        {"path": "/dev/nvidia-caps/nvidia-cap30"},
                    ],
                },
            },
        ],
        "containerEdits": {"deviceNodes": CONTROL},
    }


def test_the_control_devices_can_be_limited_to_those_the_host_has() -> None:
    spec = cdi_spec([holding("rsv_a", "gpu-0")], DEVICES, control_nodes=["/dev/nvidiactl", "/dev/nvidiactl"])

    assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidiactl"}]}


def test_only_reservations_live_now_get_an_entry(tmp_path: Path) -> None:
    with Store(tmp_path / "agent.json") as store:
        for delivery_id, (reservation_id, atom, start) in enumerate(
            [("rsv_past", "gpu-0", T0 - HOUR), ("rsv_now", "gpu-0", T0), ("rsv_later", "gpu-0", T0 + HOUR)], 1
        ):
            change = {
                "deliveryId": delivery_id,
                "kind": "assign",
                "reservationId": reservation_id,
                "atoms": [atom],
                "start": start,
                "end": start + HOUR,
            }
            assert store.apply(change, capacity={}).accepted
        now = T0 + HOUR // 2

        spec = cdi_spec(store.holdings(at_ms=now), DEVICES)

    assert [device["name"] for device in spec["devices"]] == ["rsv_now"]


def test_the_file_is_written_whole_and_not_rewritten_when_unchanged(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "cdi"
    spec = cdi_spec([holding("rsv_a", "gpu-0")], DEVICES)

    assert cdi_write(spec, directory) is True
    path = directory / "better-compute.io-reservation.json"
    assert json.loads(path.read_text()) == spec
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    written = path.stat()

    assert cdi_write(cdi_spec([holding("rsv_a", "gpu-0")], DEVICES), directory) is False
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert os.listdir(directory) == [path.name]


def test_a_failed_write_leaves_the_old_file_and_no_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = cdi_spec([holding("rsv_a", "gpu-0")], DEVICES)
    cdi_write(old, tmp_path)

    def crash(*_args: object) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(cdi.os, "replace", crash)
    with pytest.raises(OSError, match="no space left"):
        cdi_write(cdi_spec([holding("rsv_b", "gpu-1")], DEVICES), tmp_path)

    assert json.loads((tmp_path / "better-compute.io-reservation.json").read_text()) == old
    assert os.listdir(tmp_path) == ["better-compute.io-reservation.json"]


def test_a_spec_without_devices_removes_the_file(tmp_path: Path) -> None:
    cdi_write(cdi_spec([holding("rsv_a", "gpu-0")], DEVICES), tmp_path, name="spec.json")
    empty = cdi_spec([holding("rsv_nogpu", "nic-vf-1")], DEVICES)

    assert empty["devices"] == []
    assert cdi_write(empty, tmp_path, name="spec.json") is True
    assert not (tmp_path / "spec.json").exists()
    assert cdi_write(empty, tmp_path, name="spec.json") is False


def test_the_env_of_a_mig_holding_names_its_mig_devices() -> None:
    assert visible_devices_env(holding("rsv_b", "mig-2-1", "mig-2-2"), DEVICES) == {
        "CUDA_VISIBLE_DEVICES": "MIG-cccc,MIG-dddd",
        "NVIDIA_VISIBLE_DEVICES": "MIG-cccc,MIG-dddd",
    }


def test_the_env_of_a_holding_without_gpus_shows_none() -> None:
    assert visible_devices_env(holding("rsv_c", "nic-vf-1"), DEVICES) == {
        "CUDA_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
