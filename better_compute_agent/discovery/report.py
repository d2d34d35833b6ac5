"""From a snapshot to what others take: the node report the service parses, and the device map for CDI.

The report is fleet.md's "A node report", plus `gpus[].health` for a GPU the agent
found unhealthy (absent means healthy). A GPU whose uuid, name or memory could not be
read is left out of the report: the service cannot key it, and it treats a GPU that
disappears from a later report as unhealthy and unbookable, which is the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from better_compute_agent.discovery.source import Snapshot

# Opened by every CUDA process besides its GPUs' own device nodes.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MAX_REASON = 255


@dataclass(frozen=True)
class GpuDevice:
    """What a container needs to be given one bookable GPU atom."""

    uid: str  # atom uid
    env_uuid: str  # GPU-… or MIG-… for NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES
    device_nodes: tuple[
        str, ...
    ]  # /dev/nvidiaN (+ for MIG the GI and CI capability devices under /dev/nvidia-caps)


def gpu_unhealthy_reason(gpu: dict[str, Any]) -> str | None:
    """Why the snapshot's GPU is unhealthy, in one line, or None when it is healthy."""
    health = gpu.get("health") or {}
    reasons = []
    errors = health.get("queryErrors") or []
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        reasons.append(f"NVML query failed: {errors[0]}{more}")
    if health.get("retiredPagesPending"):
        reasons.append("retired memory pages pending (the GPU needs a reset)")
    if health.get("rowRemapFailure"):
        reasons.append("memory row remapping failed (the GPU needs service)")
    xids = sorted(set(health.get("xidEvents") or []))
    if xids:
        noun = "XID" if len(xids) == 1 else "XIDs"
        reasons.append(f"critical {noun} {', '.join(str(x) for x in xids)} seen")
    if not reasons:
        return None
    text = " ".join("; ".join(reasons).split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def _gpu_item(gpu: dict[str, Any]) -> dict[str, Any]:
    mig = gpu.get("mig") or {}
    enabled = bool(mig.get("enabled"))
    item: dict[str, Any] = {"uuid": gpu["uuid"], "product": gpu["name"], "memoryMiB": gpu["memoryMiB"]}
    if gpu.get("numaNode") is not None and gpu["numaNode"] >= 0:
        item["numaNode"] = gpu["numaNode"]
    if gpu.get("pciBusId"):
        item["pciBusId"] = gpu["pciBusId"]
    if gpu.get("nvlinkDomain"):
        item["nvlinkDomain"] = gpu["nvlinkDomain"]
    instances = sorted(mig.get("instances") or [], key=lambda m: (m["gi"], m["ci"])) if enabled else []
    item["mig"] = {
        "enabled": enabled,
        "instances": [
            {"gi": m["gi"], "ci": m["ci"], "profile": m["profile"], "memoryMiB": m["memoryMiB"]}
            for m in instances
        ],
    }
    reason = gpu_unhealthy_reason(gpu)
    if reason is not None:
        item["health"] = {"healthy": False, "reason": reason}
    return item


def _nic_item(nic: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"pf": nic["pf"]}
    if nic.get("linkGbps") is not None:
        item["linkGbps"] = nic["linkGbps"]
    if nic.get("numaNode") is not None and nic["numaNode"] >= 0:
        item["numaNode"] = nic["numaNode"]
    item["vfs"] = list(nic.get("vfs") or [])
    return item


def _disk_item(disk: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"id": disk["id"], "sizeGiB": disk["sizeGiB"]}
    if disk.get("media"):
        item["media"] = disk["media"]
    return item


def report_from_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    """The node report for `snapshot`, exactly as fleet.md describes it (diskGiB: the disks' sum)."""
    host = snapshot["host"]
    disks = [_disk_item(d) for d in snapshot.get("disks") or []]
    known = [g for g in snapshot["gpus"] if g.get("uuid") and g.get("name") and g.get("memoryMiB")]
    return {
        "hostname": snapshot["hostname"],
        "resources": {
            "vcpu": host["vcpu"],
            "memoryGiB": host["memoryGiB"],
            "diskGiB": sum(d["sizeGiB"] for d in disks),
            "hugepages1Gi": host["hugepages1Gi"],
        },
        "gpus": [_gpu_item(g) for g in known],
        "nics": [_nic_item(n) for n in snapshot.get("nics") or []],
        "disks": disks,
    }


def gpu_devices(snapshot: Snapshot) -> dict[str, GpuDevice]:
    """Every bookable GPU atom of the snapshot, keyed by atom uid, with what injects it.

    A whole GPU's uid is its UUID; a MIG GPU is not bookable itself, its instances are
    (`<uuid>/gi<g>/ci<c>`). A GPU without a known minor number has no device node to
    give, so it is left out. A MIG instance whose own `MIG-…` uuid is unknown is named
    the older way the NVIDIA container runtime also takes, `MIG-<GPU uuid>/<gi>/<ci>`.
    """
    devices: dict[str, GpuDevice] = {}
    for gpu in snapshot["gpus"]:
        uuid, minor = gpu.get("uuid"), gpu.get("minor")
        if not uuid or minor is None:
            continue
        node = f"/dev/nvidia{minor}"
        mig = gpu.get("mig") or {}
        if not mig.get("enabled"):
            devices[uuid] = GpuDevice(uid=uuid, env_uuid=uuid, device_nodes=(node,))
            continue
        for inst in mig.get("instances") or []:
            gi, ci = inst["gi"], inst["ci"]
            caps = tuple(path for path in (inst.get("giCapDevice"), inst.get("ciCapDevice")) if path)
            uid = f"{uuid}/gi{gi}/ci{ci}"
            devices[uid] = GpuDevice(
                uid=uid, env_uuid=inst.get("uuid") or f"MIG-{uuid}/{gi}/{ci}", device_nodes=(node, *caps)
            )
    return devices
