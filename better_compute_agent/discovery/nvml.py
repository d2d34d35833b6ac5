"""The live backend: GPUs through NVML (NVIDIA's `pynvml`, from nvidia-ml-py), the rest from /proc and /sys.

`pynvml` is imported on the first `read`, so the agent runs from a snapshot file on a
host that has neither the module nor the driver. NVML stays initialised for the life of
the source (`close` ends it), because XID events only reach an event set that was
registered when they happened.

A GPU is unhealthy when any of these holds:

* an NVML query about it fails ("not supported", or a driver too old to have the
  call, is an answer, not a failure); its error text is kept;
* retired memory pages are pending (`nvmlDeviceGetRetiredPagesPendingStatus`);
* memory row remapping failed (the failure flag of `nvmlDeviceGetRemappedRows`);
* a critical XID event was seen. Every GPU is registered once for
  `nvmlEventTypeXidCriticalError` and the event set is drained without waiting on each
  `read`. XIDs that the NVIDIA device plugin counts as an application's fault (13, 31,
  43, 45, 68, 109) are left out. As in the device plugin, a GPU that raised one stays
  unhealthy for the life of the source: after the GPU is reset, restart the agent.

A GPU whose handle or uuid cannot be read stays in the snapshot with its error but not
in the report (see `report.py`); the others are read as usual. NVLink domains: GPUs
joined by an active NVLink, to each other or to one of the host's NVSwitches, share
one domain, named `nvl-<hostname>` (then `nvl-<hostname>-1`, ... for further ones).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from better_compute_agent.discovery.source import SNAPSHOT_VERSION, DiscoveryError, HostSource, Snapshot

MIB = 1 << 20
GIB = 1 << 30
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_EVENTS_PER_READ = 4096
# Block devices that are not disks of their own: loop files, RAM disks, device-mapper and
# software RAID volumes (made of disks listed anyway), network block devices.
SKIP_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "nbd")
_UNAVAILABLE = (
    "NVML is not available on this host ({why}); "
    "run with --snapshot FILE to report from a snapshot file instead"
)


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _text(value: Any) -> str | None:
    """pynvml answers str in recent versions and bytes in older ones (and in struct fields)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).rstrip("\x00").strip() or None


def pci_sysfs_name(bus_id: str) -> str:
    """`00000000:1B:00.0` (NVML's form) → `0000:1b:00.0`, the device's name under /sys/bus/pci/devices."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except (ValueError, IndexError):
        return bus_id.strip().lower()


# --- /proc and /sys ---------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def read_hostname(proc: Path) -> str:
    return (_read(proc / "sys" / "kernel" / "hostname") or "").strip() or socket.gethostname()


def read_vcpus(proc: Path) -> int:
    """Logical CPUs: the `processor` entries of /proc/cpuinfo, else what Python counts."""
    text = _read(proc / "cpuinfo") or ""
    count = sum(1 for line in text.splitlines() if line.partition(":")[0].strip() == "processor")
    return count or os.cpu_count() or 0


def read_memory_gib(proc: Path) -> int:
    """MemTotal in GiB, rounded down."""
    for line in (_read(proc / "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key == "MemTotal":
            return int(rest.split()[0]) // (1 << 20)  # kB
    return 0


def read_hugepages_1g(sys: Path) -> int:
    return _read_int(sys / "kernel" / "mm" / "hugepages" / "hugepages-1048576kB" / "nr_hugepages") or 0


def read_numa_node(device_dir: Path) -> int | None:
    """The PCI device's NUMA node; the kernel writes -1 when the platform has none."""
    node = _read_int(device_dir / "numa_node")
    return node if node is not None and node >= 0 else None


def read_numa(sys: Path) -> list[dict[str, Any]]:
    """The NUMA nodes with their CPUs and distances, from /sys/devices/system/node (empty: none)."""
    base = sys / "devices" / "system" / "node"
    nodes = []
    for directory in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = (_read(directory / "cpulist") or "").strip()
        distances = [int(d) for d in (_read(directory / "distance") or "").split() if d.isdigit()]
        nodes.append({"node": int(directory.name[4:]), "cpus": cpus, "distances": distances})
    return [node for node in nodes if node["cpus"]]


def _link_target(path: Path) -> str:
    try:
        return Path(os.readlink(path)).name
    except OSError:
        return path.resolve().name


def _vf_number(path: Path) -> int:
    suffix = path.name.removeprefix("virtfn")
    return int(suffix) if suffix.isdigit() else -1


def read_nics(sys: Path) -> list[dict[str, Any]]:
    """SR-IOV capable interfaces (their device has `sriov_numvfs`), one per PCI function."""
    net = sys / "class" / "net"
    nics: list[dict[str, Any]] = []
    seen: set[str] = set()
    for iface in sorted(net.iterdir()) if net.is_dir() else []:
        device = iface / "device"
        if not (device / "sriov_numvfs").exists():
            continue
        address = _link_target(device)
        if address in seen:
            continue
        seen.add(address)
        speed = _read_int(iface / "speed")  # Mb/s; -1 or unreadable when the link is down
        vfs = sorted(device.glob("virtfn*"), key=_vf_number)
        nics.append(
            {
                "pf": iface.name,
                "pciAddress": address,
                "linkGbps": speed // 1000 if speed is not None and speed >= 1000 else None,
                "numaNode": read_numa_node(device),
                "vfs": [_link_target(vf) for vf in vfs],
            }
        )
    return nics


def read_disks(sys: Path) -> list[dict[str, Any]]:
    """Whole local disks: not removable, not empty, not a volume made of other block devices."""
    block = sys / "block"
    disks: list[dict[str, Any]] = []
    for dev in sorted(block.iterdir()) if block.is_dir() else []:
        if dev.name.startswith(SKIP_DISK_PREFIXES) or _read_int(dev / "removable") == 1:
            continue
        sectors = _read_int(dev / "size") or 0  # always 512-byte units, whatever the block size
        if sectors <= 0:
            continue
        if dev.name.startswith("nvme"):
            media = "nvme"
        else:
            media = "hdd" if _read_int(dev / "queue" / "rotational") == 1 else "ssd"
        disks.append({"id": dev.name, "sizeGiB": sectors * 512 // GIB, "media": media})
    return disks


def read_mig_minors(proc: Path) -> dict[str, int]:
    """/proc/driver/nvidia-caps/mig-minors: `gpu0/gi1/access 12` → {"gpu0/gi1/access": 12}."""
    minors: dict[str, int] = {}
    for line in (_read(proc / "driver" / "nvidia-caps" / "mig-minors") or "").splitlines():
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdigit():
            minors[name] = int(number)
    return minors


def nvlink_domains(hostname: str, links: list[tuple[str | None, set[str]]]) -> list[str | None]:
    """Each GPU's NVLink domain, from (its PCI address, the addresses its active links reach)."""
    local = {bus: i for i, (bus, _) in enumerate(links) if bus}
    switch = len(links)  # a peer that is no GPU of this host: one of its NVSwitches
    parent = list(range(len(links) + 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, (_, remotes) in enumerate(links):
        for remote in remotes:
            parent[find(i)] = find(local.get(remote, switch))
    names: dict[int, str] = {}
    domains: list[str | None] = []
    for i, (_, remotes) in enumerate(links):
        if not remotes:
            domains.append(None)
            continue
        root = find(i)
        if root not in names:
            k = len(names)
            name = f"nvl-{hostname}" + (f"-{k}" if k else "")
            names[root] = name if len(name) <= 128 else f"nvl-{k}"
        domains.append(names[root])
    return domains


# --- NVML -------------------------------------------------------------------------------------


class _Queries:
    """Runs NVML calls about one GPU; a failure becomes a line of its health instead of an exception."""

    def __init__(self, nvml: Any, errors: list[str]) -> None:
        self.nvml = nvml
        self.errors = errors

    def __call__(self, name: str, *args: Any, absent: tuple[int, ...] = ()) -> Any:
        """The call's answer, or None when it failed or the GPU does not support it."""
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:  # an older pynvml without this call: as good as "not supported"
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if exc.value not in (*_unsupported(self.nvml), *absent):
                self.errors.append(f"{name}: {_one_line(exc)}")
            return None


def _unsupported(nvml: Any) -> tuple[int, int]:
    """The codes that mean "this GPU or driver has no such query": an answer, not a fault."""
    return (nvml.NVML_ERROR_NOT_SUPPORTED, getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))


def _profile_from_name(name: str | None) -> str | None:
    """`NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`: a MIG device's name ends in its profile."""
    words = (name or "").split()
    return words[words.index("MIG") + 1] if "MIG" in words[:-1] else None


def _profile_from_attributes(attributes: Any) -> str | None:
    """The profile from the instance's slice counts and memory, for a driver whose names lack it."""
    if attributes is None:
        return None
    gi, ci = int(attributes.gpuInstanceSliceCount), int(attributes.computeInstanceSliceCount)
    gb = -(-int(attributes.memorySizeMB) // 1024)  # NVIDIA's names round the size up: 9728 MiB → 10gb
    return f"{ci}c.{gi}g.{gb}gb" if ci < gi else f"{gi}g.{gb}gb"


def _nvlink_remotes(nvml: Any, handle: Any) -> set[str]:
    """PCI addresses (sysfs form) at the far end of the GPU's active NVLinks; none without NVLink.

    An active link whose far end NVML cannot name counts as reaching the host's NVSwitches.
    """
    remotes: set[str] = set()
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            if exc.value in (*_unsupported(nvml), nvml.NVML_ERROR_INVALID_ARGUMENT):
                break  # no NVLink at all, or past the GPU's last link
            continue
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        try:
            bus = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvml.NVMLError:
            bus = None
        remotes.add(pci_sysfs_name(bus) if bus else "unknown")
    return remotes


class NvmlSource(HostSource):
    """The host as NVML, /proc and /sys see it now; `proc`, `sys` and `dev` are their roots."""

    def __init__(
        self, *, proc: Path = Path("/proc"), sys: Path = Path("/sys"), dev: Path = Path("/dev")
    ) -> None:
        self.proc, self.sys, self.dev = Path(proc), Path(sys), Path(dev)
        self._nvml: Any = None
        self._events: Any = None
        self._registered: set[str] = set()
        self._xids: dict[str, set[int]] = {}

    def read(self) -> Snapshot:
        nvml = self._open()
        hostname = read_hostname(self.proc)
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML cannot list this host's GPUs ({_one_line(exc)})") from None
        minors = read_mig_minors(self.proc)
        read = [self._read_gpu(nvml, index, minors) for index in range(count)]
        gpus = [gpu for gpu, _, _ in read]
        peers = [(pci_sysfs_name(g["pciBusId"]) if g["pciBusId"] else None, links) for g, _, links in read]
        for gpu, domain in zip(gpus, nvlink_domains(hostname, peers), strict=True):
            gpu["nvlinkDomain"] = domain
        self._poll_xids(nvml, [(gpu["uuid"], handle) for gpu, handle, _ in read if gpu["uuid"]], gpus)
        return {
            "snapshotVersion": SNAPSHOT_VERSION,
            "hostname": hostname,
            "driverVersion": driver,
            "host": {
                "vcpu": read_vcpus(self.proc),
                "memoryGiB": read_memory_gib(self.proc),
                "hugepages1Gi": read_hugepages_1g(self.sys),
            },
            "gpus": gpus,
            "nics": read_nics(self.sys),
            "disks": read_disks(self.sys),
            "numa": read_numa(self.sys),
        }

    def gpu_processes(self) -> dict[str, list[int]]:
        """GPU UUID → the compute and graphics processes NVML sees on it (a GPU it cannot ask is left out)."""
        nvml = self._open()
        out: dict[str, list[int]] = {}
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            return out
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                continue
            pids: set[int] = set()
            for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                function = getattr(nvml, call, None)
                if function is None:
                    continue
                with contextlib.suppress(nvml.NVMLError):
                    pids.update(int(info.pid) for info in function(handle))
            if uuid and pids:
                out[uuid] = sorted(pids)
        return out

    def close(self) -> None:
        """Free the event set and end NVML; a later `read` starts afresh."""
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        if self._events is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._events)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
        self._events = None
        self._registered.clear()

    def _open(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml  # type: ignore[import-not-found]
        except ImportError:
            raise DiscoveryError(
                _UNAVAILABLE.format(why="the pynvml module, from nvidia-ml-py, is not installed")
            ) from None
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:
            raise DiscoveryError(_UNAVAILABLE.format(why=_one_line(exc))) from None
        self._nvml = pynvml
        return pynvml

    def _read_gpu(
        self, nvml: Any, index: int, minors: dict[str, int]
    ) -> tuple[dict[str, Any], Any, set[str]]:
        """One GPU's snapshot entry, its handle (None when lost) and its NVLink peers."""
        errors: list[str] = []
        query = _Queries(nvml, errors)
        health = {
            "retiredPagesPending": False,
            "rowRemapFailure": False,
            "xidEvents": [],
            "queryErrors": errors,
        }
        gpu: dict[str, Any] = dict.fromkeys(("uuid", "name", "memoryMiB", "pciBusId", "minor", "numaNode"))
        gpu.update(index=index, nvlinkDomain=None, mig={"enabled": False, "instances": []}, health=health)
        handle = query("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return gpu, None, set()
        gpu["uuid"] = _text(query("nvmlDeviceGetUUID", handle))
        gpu["name"] = _text(query("nvmlDeviceGetName", handle))
        memory = query("nvmlDeviceGetMemoryInfo", handle)
        gpu["memoryMiB"] = int(memory.total) // MIB if memory is not None else None
        pci = query("nvmlDeviceGetPciInfo", handle)
        gpu["pciBusId"] = _text(pci.busId) if pci is not None else None
        gpu["minor"] = query("nvmlDeviceGetMinorNumber", handle)
        if gpu["pciBusId"]:
            gpu["numaNode"] = read_numa_node(
                self.sys / "bus" / "pci" / "devices" / pci_sysfs_name(gpu["pciBusId"])
            )
        gpu["mig"] = self._read_mig(query, handle, gpu["minor"], minors)
        health["retiredPagesPending"] = (
            query("nvmlDeviceGetRetiredPagesPendingStatus", handle) == nvml.NVML_FEATURE_ENABLED
        )
        remapped = query("nvmlDeviceGetRemappedRows", handle)  # (corrected, uncorrected, pending, failed)
        health["rowRemapFailure"] = bool(remapped[3]) if remapped is not None else False
        return gpu, handle, _nvlink_remotes(nvml, handle)

    def _read_mig(
        self, query: _Queries, handle: Any, minor: int | None, minors: dict[str, int]
    ) -> dict[str, Any]:
        nvml = query.nvml
        mode = query("nvmlDeviceGetMigMode", handle)  # [current, pending]
        if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return {"enabled": False, "instances": []}
        instances = []
        for i in range(query("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = query("nvmlDeviceGetMigDeviceHandleByIndex", handle, i, absent=(nvml.NVML_ERROR_NOT_FOUND,))
            if mig is None:
                continue
            gi = query("nvmlDeviceGetGpuInstanceId", mig)
            ci = query("nvmlDeviceGetComputeInstanceId", mig)
            memory = query("nvmlDeviceGetMemoryInfo", mig)
            if gi is None or ci is None or memory is None:
                continue
            name = _text(query("nvmlDeviceGetName", mig))
            profile = _profile_from_name(name) or _profile_from_attributes(
                query("nvmlDeviceGetAttributes", mig)
            )
            if profile is None:
                query.errors.append(f"MIG instance gi{gi}/ci{ci}: its profile cannot be read")
                continue
            instances.append(
                {
                    "gi": int(gi),
                    "ci": int(ci),
                    "profile": profile,
                    "memoryMiB": int(memory.total) // MIB,
                    "uuid": _text(query("nvmlDeviceGetUUID", mig)),
                    "giCapDevice": self._cap_device(minors, f"gpu{minor}/gi{gi}/access"),
                    "ciCapDevice": self._cap_device(minors, f"gpu{minor}/gi{gi}/ci{ci}/access"),
                }
            )
        return {"enabled": True, "instances": sorted(instances, key=lambda m: (m["gi"], m["ci"]))}

    def _cap_device(self, minors: dict[str, int], name: str) -> str | None:
        number = minors.get(name)
        return str(self.dev / "nvidia-caps" / f"nvidia-cap{number}") if number is not None else None

    def _poll_xids(self, nvml: Any, handles: list[tuple[str, Any]], gpus: list[dict[str, Any]]) -> None:
        """Register new GPUs for critical XIDs, drain what arrived since the last read, record it."""
        try:
            if self._events is None:
                self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return  # no event sets here: XIDs do not count, the other health facts still do
        for uuid, handle in handles:
            if uuid not in self._registered:
                self._registered.add(uuid)
                with contextlib.suppress(nvml.NVMLError):  # this GPU cannot report XIDs
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        owner = {gpu["uuid"]: gpu["uuid"] for gpu in gpus if gpu["uuid"]}
        owner.update({m["uuid"]: gpu["uuid"] for gpu in gpus for m in gpu["mig"]["instances"] if m["uuid"]})
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = wait(self._events, 0)
            except nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing more has arrived
            xid = int(event.eventData)
            if not int(event.eventType) & nvml.nvmlEventTypeXidCriticalError or xid in APPLICATION_XIDS:
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device)) or ""
            except nvml.NVMLError:
                continue  # the GPU is gone; its absence from the report says enough
            self._xids.setdefault(owner.get(uuid, uuid), set()).add(xid)
        for gpu in gpus:
            gpu["health"]["xidEvents"] = sorted(self._xids.get(gpu["uuid"] or "", set()))
