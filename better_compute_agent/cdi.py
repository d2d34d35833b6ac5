"""The CDI spec that lets a container ask for a reservation's GPUs by name.

A container runtime with CDI support (containerd, CRI-O, Podman, Docker) reads
the spec files in `/var/run/cdi` and, for `--device better-compute.io/reservation=rsv_…`,
adds that reservation's GPU device nodes and sets `NVIDIA_VISIBLE_DEVICES` and
`CUDA_VISIBLE_DEVICES` to its GPU (or MIG) UUIDs. The agent rewrites the file when
what is live on the node changes, so a reservation's name stops working when it ends.
The format is the Container Device Interface specification of cncf-tags
(`container-device-interface/SPEC.md`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from better_compute_agent.guard import RESERVATION_ID
from better_compute_agent.store import Holding

# CDI spec version 0.6.0, not the newest (1.1.0): a runtime refuses a version its
# CDI library does not know, so an older one reaches more runtimes. Everything
# written here (`env`, `deviceNodes` with only a `path`, a kind whose name has no
# dot, device names that start with a letter) has been valid since 0.3.0, which
# is where to go should a host's runtime predate 0.6.0 (libraries before 2023).
CDI_VERSION = "0.6.0"
KIND = "better-compute.io/reservation"
DEFAULT_DIRECTORY = Path("/var/run/cdi")
DEFAULT_NAME = "better-compute.io-reservation.json"
# The driver's shared devices: every container with a GPU needs them, whatever its GPUs.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# What a container sees with no GPU: nothing from the NVIDIA runtime ("void", as
# an empty value can read as unset and an image's default of "all" would win).
NO_NVIDIA_DEVICES = "void"


class GpuDeviceLike(Protocol):
    """What the spec needs of one GPU or MIG device that discovery found."""

    @property
    def uid(self) -> str:
        """The atom uid the service books (the key in `devices`)."""
        ...

    @property
    def env_uuid(self) -> str:
        """What `CUDA_VISIBLE_DEVICES` names it by: `GPU-…`, or `MIG-…` for a MIG device."""
        ...

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """Its device files, e.g. `/dev/nvidia0` (and the MIG capability files for a MIG device)."""
        ...


def device_of(atom: str, devices: Mapping[str, GpuDeviceLike]) -> str | None:
    """The device an atom is: itself, or for a time-slice or MPS slot (`<gpu>/s<N>`) the GPU it shares."""
    uid = atom
    while uid:
        if uid in devices:
            return uid
        uid = uid.rpartition("/")[0]
    return None


def _gpus(atoms: Iterable[str], devices: Mapping[str, GpuDeviceLike]) -> list[GpuDeviceLike]:
    """The reservation's GPU devices in discovery order (so device 0 in the container is the lowest)."""
    wanted = {uid for atom in atoms if (uid := device_of(atom, devices)) is not None}
    return [device for uid, device in devices.items() if uid in wanted]


def visible_devices_env(holding: Holding, devices: Mapping[str, GpuDeviceLike]) -> dict[str, str]:
    """The variables that show a process only its reservation's GPUs (UUIDs, MIG ones included).

    With no GPU on this node the process sees none: `CUDA_VISIBLE_DEVICES` empty and
    `NVIDIA_VISIBLE_DEVICES=void`.
    """
    uuids = ",".join(device.env_uuid for device in _gpus(holding.atoms, devices))
    return {"CUDA_VISIBLE_DEVICES": uuids, "NVIDIA_VISIBLE_DEVICES": uuids or NO_NVIDIA_DEVICES}


def cdi_spec(
    holdings: Iterable[Holding],
    devices: Mapping[str, GpuDeviceLike],
    *,
    control_nodes: Sequence[str] = CONTROL_NODES,
) -> dict[str, Any]:
    """The spec with one device per holding (pass the live ones: `store.holdings(at_ms=now)`).

    A holding with no GPU on this node (only NIC VFs, disks or the node atom)
    gets no entry: there is nothing for a runtime to add, and asking for it
    should fail loudly rather than start a container without GPUs. Atoms not in
    `devices` are skipped the same way. The control nodes are the spec-wide
    edits, applied once whatever devices a container asks for; pass only those
    that exist on the host, as a runtime refuses a device node it cannot find.
    A holding whose id is not a valid CDI device name is left out (the store
    accepts none). With no entry the spec has no devices, which CDI does not
    allow in a file: `cdi_write` then removes the file.
    """
    control = list(dict.fromkeys(control_nodes))
    entries: dict[str, dict[str, Any]] = {}
    for holding in holdings:
        gpus = _gpus(holding.atoms, devices)
        if not gpus or not RESERVATION_ID.match(holding.reservation_id):
            continue
        uuids = ",".join(gpu.env_uuid for gpu in gpus)
        # Two MIG devices of one GPU share its device file: list each file once.
        paths = dict.fromkeys(path for gpu in gpus for path in gpu.device_nodes if path not in control)
        entries[holding.reservation_id] = {
            "name": holding.reservation_id,
            "containerEdits": {
                "env": [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"],
                "deviceNodes": [{"path": path} for path in paths],
            },
        }
    spec: dict[str, Any] = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        # Sorted, so the same holdings give the same bytes and the file is not rewritten.
        "devices": [entries[name] for name in sorted(entries)],
    }
    if control:
        spec["containerEdits"] = {"deviceNodes": [{"path": path} for path in control]}
    return spec


def _replace(path: Path, content: bytes) -> None:
    """Write `content` to `path` so a reader sees the old file or the new one, never half of one."""
    # The temporary name ends in neither .json nor .yaml, so a runtime watching
    # the directory never loads it.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)  # runtimes and their plugins read it; it holds no secret
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    # The rename (or removal) itself survives a crash only once the directory is synced.
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def cdi_write(spec: dict[str, Any], directory: Path = DEFAULT_DIRECTORY, *, name: str = DEFAULT_NAME) -> bool:
    """Put the spec in place atomically; False, without touching the file, when it holds this already.

    A spec without devices is not a valid CDI file, so then the file is removed
    (True when there was one to remove).
    """
    path = directory / name
    if not spec.get("devices"):
        if not path.exists():
            return False
        path.unlink()
        _sync_directory(directory)
        return True
    content = (json.dumps(spec, indent=2) + "\n").encode()
    try:
        if path.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    _replace(path, content)
    return True
