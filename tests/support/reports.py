"""Node reports, as a node agent sends them to `inventory/report`."""

from __future__ import annotations

from typing import Any


def gpu(i: int, *, mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """GPU `i` of an eight-GPU H100 host (the first four on NUMA 0), MIG-partitioned when `mig` is given."""
    return {
        "uuid": f"GPU-00000000-0000-4000-8000-{i:012d}",
        "product": "NVIDIA H100 80GB HBM3",
        "memoryMiB": 81559,
        "numaNode": 0 if i < 4 else 1,
        "pciBusId": f"00000000:{0x18 + i:02x}:00.0",
        "nvlinkDomain": "nvl-0",
        "mig": {"enabled": mig is not None, "instances": mig or []},
    }


def report(hostname: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """A full report: scalars, `gpus`, a NIC with two VFs and a disk."""
    return {
        "hostname": hostname,
        "resources": {"vcpu": 224, "memoryGiB": 2016, "diskGiB": 28000, "hugepages1Gi": 1600},
        "gpus": gpus,
        "nics": [{"pf": "mlx5_0", "linkGbps": 400, "numaNode": 0, "vfs": ["0000:3b:00.2", "0000:3b:00.3"]}],
        "disks": [{"id": "nvme0n1", "sizeGiB": 3576, "media": "nvme"}],
    }


def mig(*profiles: str) -> list[dict[str, Any]]:
    """MIG instances of these profiles, numbered from GI 1."""
    sizes = {"1g.10gb": 9728, "3g.40gb": 40192, "7g.80gb": 80896, "2g.20gb": 19968}
    return [{"gi": g + 1, "ci": 0, "profile": p, "memoryMiB": sizes[p]} for g, p in enumerate(profiles)]
