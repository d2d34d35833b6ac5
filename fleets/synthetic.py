"""Synthetic fleets: a seeded, realistic fleet file for demos and benchmarks (`make_fleet`)."""

from __future__ import annotations

import random
import uuid
from typing import Any

# --- synthetic fleets -------------------------------------------------------------------------

GPU_KINDS: dict[str, dict[str, Any]] = {
    "H100": {"product": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559},
    "H200": {"product": "NVIDIA H200", "memoryMiB": 143771},
    "A100": {"product": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920},
    "L40S": {"product": "NVIDIA L40S", "memoryMiB": 46068},
}
# MIG layouts of an 80 GB A100/H100 (each a valid placement of its profiles).
MIG_LAYOUTS: list[list[tuple[str, int]]] = [
    [("7g.80gb", 80896)],
    [("3g.40gb", 40192), ("3g.40gb", 40192)],
    [("3g.40gb", 40192), ("2g.20gb", 19968), ("1g.10gb", 9728)],
    [("1g.10gb", 9728)] * 7,
]
PCI_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db", "1b", "2b", "3b", "5e", "9b", "ac", "bb", "dc"]
NIC_BUSES = ["0c", "8c", "4c", "cc"]


def _uuid(rng: random.Random) -> str:
    return f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def fleet_node_report(
    *,
    rng: random.Random,
    hostname: str,
    model: str,
    gpus: int,
    mig: bool = False,
    nvlink_domain: str | None = None,
) -> dict[str, Any]:
    """One realistic node report: GPUs 0..n/2-1 on NUMA 0 and the rest on 1, NICs with VFs, NVMe disks."""
    kind = GPU_KINDS[model]
    half = max(1, gpus // 2)
    layout = rng.choice(MIG_LAYOUTS) if mig else []
    gpu_list = []
    for i in range(gpus):
        gpu: dict[str, Any] = {
            "uuid": _uuid(rng),
            "product": kind["product"],
            "memoryMiB": kind["memoryMiB"],
            "numaNode": 0 if i < half else 1,
            "pciBusId": f"00000000:{PCI_BUSES[i % len(PCI_BUSES)]}:00.0",
            "mig": {
                "enabled": mig,
                "instances": [
                    {"gi": g + 1, "ci": 0, "profile": profile, "memoryMiB": mem}
                    for g, (profile, mem) in enumerate(layout)
                ],
            },
        }
        if nvlink_domain is not None:
            gpu["nvlinkDomain"] = nvlink_domain
        gpu_list.append(gpu)
    nics = [
        {
            "pf": f"mlx5_{k}",
            "linkGbps": 400,
            "numaNode": 0 if k < 2 else 1,
            "vfs": [f"0000:{NIC_BUSES[k]}:00.{f}" for f in range(2, 4)],
        }
        for k in range(2 if gpus <= 4 else 4)
    ]
    disks = [{"id": f"nvme{k}n1", "sizeGiB": 3576, "media": "nvme"} for k in range(2 if gpus <= 4 else 8)]
    vcpu = rng.choice([192, 224, 256])
    return {
        "hostname": hostname,
        "resources": {
            "vcpu": vcpu,
            "memoryGiB": 2016 if gpus > 4 else 1008,
            "diskGiB": sum(d["sizeGiB"] for d in disks),
            "hugepages1Gi": 1600 if gpus > 4 else 800,
        },
        "gpus": gpu_list,
        "nics": nics,
        "disks": disks,
    }


TENANTS = [
    {"id": "acme", "name": "Acme Corp"},
    {"id": "beta", "name": "Beta Labs"},
    {"id": "gamma", "name": "Gamma Research"},
]
REGIONS = ["east", "west", "central", "north", "south"]


def _pool_plan(pools: int, mig_share: float, timeslice_share: float) -> list[dict[str, Any]]:
    """`pools` pools: the first few shares MIG and time-slice, the rest exclusive H100/H200/A100."""
    n_mig = min(pools, round(pools * mig_share)) if mig_share > 0 else 0
    n_ts = min(pools - n_mig, round(pools * timeslice_share)) if timeslice_share > 0 else 0
    if mig_share > 0 and n_mig == 0 and pools - n_ts >= 2:
        n_mig = 1
    if timeslice_share > 0 and n_ts == 0 and pools - n_mig >= 2:
        n_ts = 1
    plan: list[dict[str, Any]] = []
    exclusive_models = ["H100", "H200", "A100"]
    for i in range(pools):
        owner = TENANTS[i % len(TENANTS)]["id"]
        region = REGIONS[(i // len(TENANTS)) % len(REGIONS)]
        suffix = f"-{i // (len(TENANTS) * len(REGIONS)) + 1}" if i >= len(TENANTS) * len(REGIONS) else ""
        others = [t["id"] for t in TENANTS if t["id"] != owner]
        pool: dict[str, Any]
        if i < n_mig:
            model = "A100" if i % 2 == 0 else "H100"
            pool = {
                "name": f"{model.lower()}-mig-{region}{suffix}",
                "owner": owner,
                "gpuModel": model,
                "sharing": "mig",
            }
            pool["offers"] = [{"tenant": others[0], "quota": {"gpu.mig": 56}}]
        elif i < n_mig + n_ts:
            pool = {
                "name": f"l40s-ts-{region}{suffix}",
                "owner": owner,
                "gpuModel": "L40S",
                "sharing": "timeslice",
                "slotsPerGpu": 4,
                "offers": [{"tenant": t, "quota": {"gpu.slot": 64}} for t in others],
            }
        else:
            model = exclusive_models[(i - n_mig - n_ts) % len(exclusive_models)]
            pool = {
                "name": f"{model.lower()}-{region}{suffix}",
                "owner": owner,
                "gpuModel": model,
                "sharing": "exclusive",
                "offers": [{"tenant": others[0], "quota": {"gpu": 64, "vcpu": 2048}}],
            }
        plan.append(pool)
    return plan


# Special states, by node index modulo this cycle (index 0..6 of every 50 nodes), so a fleet
# of any size has a few of each non-schedulable state spread over its pools.
_STATE_CYCLE = 50


def _node_state(index: int, pool_owner: str) -> dict[str, Any]:
    slot = index % _STATE_CYCLE
    if slot == 7:
        return {"cordoned": True}
    if slot == 17:
        return {"maintenance": True}
    if slot == 27:
        return {"connectivity": "disconnected"}
    if slot == 37:
        return {"provisionState": "deploying", "convergedSpecs": 0}
    if slot == 47:
        return {"taints": [{"key": "gpu.health/xid-79", "value": "fallen-off-bus", "effect": "NoSchedule"}]}
    if slot == 23:
        return {"trust": "tenant-owned", "owner": pool_owner}
    if slot == 33:
        return {"role": "controller"}
    if slot == 43:
        return {"taints": [{"key": "thermal", "value": "warm", "effect": "PreferNoSchedule"}]}
    return {}


def fleet_generate(
    *,
    nodes: int,
    gpus_per_node: int = 8,
    pools: int | None = None,
    mig_share: float = 0.2,
    timeslice_share: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """A synthetic fleet document, the same for the same arguments (all randomness from `seed`)."""
    rng = random.Random(seed)
    pools = pools if pools is not None else max(1, min(12, nodes // 8 or 1))
    plan = _pool_plan(pools, mig_share, timeslice_share)
    node_list: list[dict[str, Any]] = []
    for i in range(nodes):
        pool = plan[i % len(plan)]
        rack = i // 16 + 1
        fabric = f"ib-{pool['name']}-{rack // 8 + 1}"
        hostname = f"gpu-{pool['gpuModel'].lower()}-{i + 1:05d}"
        report = fleet_node_report(
            rng=rng,
            hostname=hostname,
            model=pool["gpuModel"],
            gpus=gpus_per_node,
            mig=pool["sharing"] == "mig",
            nvlink_domain=f"nvl-{hostname}" if pool["gpuModel"] in ("H100", "H200", "A100") else None,
        )
        node: dict[str, Any] = {
            "hostname": hostname,
            "pool": f"{pool['owner']}/{pool['name']}",
            "labels": {"fabric": fabric, "rack": f"r{rack:03d}"},
            "ratios": {"vcpu": 2.0} if pool["sharing"] == "timeslice" else {},
            **_node_state(i, pool["owner"]),
            "report": report,
        }
        node_list.append(node)
    return {"tenants": TENANTS, "pools": plan, "nodes": node_list}
