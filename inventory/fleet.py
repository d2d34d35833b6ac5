"""Fleet files: one JSON document of tenants, pools, offerings and nodes with their reports.

`fleet_parse` validates the whole document (every node's report included) before
anything is written, so a bad file is refused whole with the path of each bad
field (`nodes[3].report.gpus[2].memoryMiB`). `fleet_load` then writes it in one
transaction, set-based and in batches, and is idempotent: loading the same file
twice leaves the same rows. `fleet_generate` writes a synthetic, deterministic
fleet for demos and benchmarks.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Func

from capacity.models import QuotaUsage
from core.errors import InvalidInput
from inventory.models import (
    Connectivity,
    Node,
    Offering,
    Pool,
    ProvisionState,
    Role,
    ScalarResource,
    Sharing,
    Taint,
    TaintEffect,
    Tenant,
    Trust,
)
from inventory.reports import HOSTNAME_RE, NodeReport, report_parse
from inventory.services import NODE_REGISTRATION_FIELDS, inventory_apply_reports

TENANT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
POOL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
QUOTA_RESOURCES = ("gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node", *ScalarResource.values)
BATCH_NODES = 500
# Choice lists built once: the parser checks them for every node of a 10,000-node file.
ROLES = list(Role.values)
TRUSTS = list(Trust.values)
PROVISION_STATES = list(ProvisionState.values)
CONNECTIVITIES = list(Connectivity.values)
TAINT_EFFECTS = list(TaintEffect.values)
SCALAR_NAMES = list(ScalarResource.values)


@dataclass
class PoolSpec:
    owner: str
    name: str
    gpu_model: str
    sharing: str
    slots_per_gpu: int | None
    notice_seconds: int
    archived: bool
    offers: dict[str, dict[str, int]]  # tenant -> {resource: max}

    @property
    def key(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class NodeSpec:
    hostname: str
    pool: str  # owner/name
    fields: dict[str, Any]
    taints: list[dict[str, str]]
    ratios: dict[str, float]
    report: NodeReport | None


@dataclass
class FleetSpec:
    tenants: dict[str, str] = field(default_factory=dict)
    pools: list[PoolSpec] = field(default_factory=list)
    nodes: list[NodeSpec] = field(default_factory=list)


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append({"field": path, "message": message})


def _check_keys(errors: _Errors, path: str, value: Any, required: set[str], optional: set[str]) -> bool:
    if not isinstance(value, dict):
        errors.add(path, "must be an object")
        return False
    for key in value:
        if key not in required | optional:
            errors.add(f"{path}.{key}", "unknown field")
    for key in sorted(required - set(value)):
        errors.add(f"{path}.{key}", "required")
    return True


def _choice(errors: _Errors, path: str, value: Any, choices: list[str]) -> str | None:
    if value not in choices:
        errors.add(path, f"must be one of {', '.join(choices)}")
        return None
    return str(value)


def _bool(errors: _Errors, path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        errors.add(path, "must be a boolean")
        return False
    return value


def _int(errors: _Errors, path: str, value: Any, lo: int, hi: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        errors.add(path, f"must be an integer between {lo} and {hi}")
        return None
    return value


def _match(errors: _Errors, path: str, value: Any, pattern: re.Pattern[str]) -> str | None:
    if not isinstance(value, str) or not pattern.match(value):
        errors.add(path, f"must match {pattern.pattern}")
        return None
    return value


def _parse_quota(errors: _Errors, path: str, value: Any) -> dict[str, int]:
    quota: dict[str, int] = {}
    if not isinstance(value, dict):
        errors.add(path, "must be an object")
        return quota
    for resource, limit in value.items():
        if resource not in QUOTA_RESOURCES:
            errors.add(f"{path}.{resource}", f"unknown resource (one of {', '.join(QUOTA_RESOURCES)})")
            continue
        checked = _int(errors, f"{path}.{resource}", limit, 0, 1 << 40)
        if checked is not None:
            quota[resource] = checked
    return quota


def _parse_pool(errors: _Errors, path: str, raw: Any, tenants: dict[str, str]) -> PoolSpec | None:
    if not _check_keys(
        errors,
        path,
        raw,
        {"name", "owner"},
        {"gpuModel", "sharing", "slotsPerGpu", "noticeSeconds", "archived", "offers"},
    ):
        return None
    name = _match(errors, f"{path}.name", raw.get("name"), POOL_NAME_RE)
    owner = _match(errors, f"{path}.owner", raw.get("owner"), TENANT_RE)
    if owner is not None and owner not in tenants:
        errors.add(f"{path}.owner", f"unknown tenant {owner}")
    gpu_model = raw.get("gpuModel", "")
    if not isinstance(gpu_model, str) or len(gpu_model) > 64:
        errors.add(f"{path}.gpuModel", "must be a string of at most 64 characters")
        gpu_model = ""
    sharing = _choice(errors, f"{path}.sharing", raw.get("sharing", "exclusive"), list(Sharing.values))
    slots = None
    if sharing in (Sharing.TIMESLICE, Sharing.MPS):
        slots = _int(errors, f"{path}.slotsPerGpu", raw.get("slotsPerGpu"), 1, 64)
    elif "slotsPerGpu" in raw:
        errors.add(f"{path}.slotsPerGpu", "only for timeslice or mps pools")
    notice = _int(errors, f"{path}.noticeSeconds", raw.get("noticeSeconds", 30), 0, 86400)
    archived = _bool(errors, f"{path}.archived", raw.get("archived", False))
    offers: dict[str, dict[str, int]] = {}
    offers_raw = raw.get("offers", [])
    if not isinstance(offers_raw, list):
        errors.add(f"{path}.offers", "must be a list")
        offers_raw = []
    for i, offer in enumerate(offers_raw):
        opath = f"{path}.offers[{i}]"
        if not _check_keys(errors, opath, offer, {"tenant"}, {"quota"}):
            continue
        tenant = _match(errors, f"{opath}.tenant", offer.get("tenant"), TENANT_RE)
        if tenant is not None and tenant not in tenants:
            errors.add(f"{opath}.tenant", f"unknown tenant {tenant}")
        elif tenant is not None and tenant == owner:
            errors.add(f"{opath}.tenant", "a pool is not offered to its owner")
        elif tenant in offers:
            errors.add(f"{opath}.tenant", f"offered to {tenant} twice")
        elif tenant is not None:
            offers[tenant] = _parse_quota(errors, f"{opath}.quota", offer.get("quota", {}))
    if name is None or owner is None or sharing is None or notice is None:
        return None
    return PoolSpec(owner, name, gpu_model, sharing, slots, notice, archived, offers)


NODE_KEYS = {
    "pool",
    "role",
    "trust",
    "owner",
    "provisionState",
    "connectivity",
    "maintenance",
    "cordoned",
    "taints",
    "convergedSpecs",
    "labels",
    "ratios",
    "report",
}


def _parse_node(
    errors: _Errors, path: str, raw: Any, pools: dict[str, list[str]], tenants: dict[str, str]
) -> NodeSpec | None:
    if not _check_keys(errors, path, raw, {"hostname", "pool"}, NODE_KEYS):
        return None
    hostname = _match(errors, f"{path}.hostname", raw.get("hostname"), HOSTNAME_RE)
    pool_ref = raw.get("pool")
    pool_key = None
    if isinstance(pool_ref, str) and "/" in pool_ref:
        pool_key = pool_ref if pool_ref in {k for ks in pools.values() for k in ks} else None
        if pool_key is None:
            errors.add(f"{path}.pool", f"unknown pool {pool_ref}")
    elif isinstance(pool_ref, str):
        matches = pools.get(pool_ref, [])
        if len(matches) == 1:
            pool_key = matches[0]
        else:
            errors.add(
                f"{path}.pool",
                f"unknown pool {pool_ref}" if not matches else f"ambiguous pool {pool_ref}: say owner/name",
            )
    else:
        errors.add(f"{path}.pool", "must be a string")
    fields: dict[str, Any] = {
        "role": _choice(errors, f"{path}.role", raw.get("role", "host"), ROLES),
        "trust": _choice(errors, f"{path}.trust", raw.get("trust", "platform"), TRUSTS),
        "provision_state": _choice(
            errors,
            f"{path}.provisionState",
            raw.get("provisionState", "deployed"),
            PROVISION_STATES,
        ),
        "connectivity": _choice(
            errors, f"{path}.connectivity", raw.get("connectivity", "connected"), CONNECTIVITIES
        ),
        "maintenance": _bool(errors, f"{path}.maintenance", raw.get("maintenance", False)),
        "cordoned": _bool(errors, f"{path}.cordoned", raw.get("cordoned", False)),
        "converged_specs": _int(errors, f"{path}.convergedSpecs", raw.get("convergedSpecs", 1), 0, 1 << 20),
    }
    owner = raw.get("owner")
    if fields["trust"] == Trust.TENANT_OWNED:
        if owner not in tenants:
            errors.add(f"{path}.owner", "a tenant-owned node names a known owner tenant")
    elif owner is not None:
        errors.add(f"{path}.owner", "only tenant-owned nodes have an owner")
    fields["owner_id"] = owner if fields["trust"] == Trust.TENANT_OWNED else None
    labels = raw.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in labels.items()
    ):
        errors.add(f"{path}.labels", "must be an object of strings")
        labels = {}
    fields["labels"] = labels
    taints: list[dict[str, str]] = []
    taints_raw = raw.get("taints", [])
    if not isinstance(taints_raw, list):
        errors.add(f"{path}.taints", "must be a list")
        taints_raw = []
    keys: set[str] = set()
    for i, taint in enumerate(taints_raw):
        tpath = f"{path}.taints[{i}]"
        if not _check_keys(errors, tpath, taint, {"key", "effect"}, {"value", "reason"}):
            continue
        key = taint.get("key")
        if not isinstance(key, str) or not key or len(key) > 253:
            errors.add(f"{tpath}.key", "must be a non-empty string")
            continue
        if key in keys:
            errors.add(f"{tpath}.key", f"duplicate taint key {key}")
            continue
        keys.add(key)
        effect = _choice(errors, f"{tpath}.effect", taint.get("effect"), TAINT_EFFECTS)
        value = taint.get("value", "")
        reason = taint.get("reason", "")
        if not isinstance(value, str) or not isinstance(reason, str):
            errors.add(tpath, "value and reason must be strings")
            continue
        if effect is not None:
            taints.append({"key": key, "value": value, "effect": effect, "reason": reason})
    ratios: dict[str, float] = {}
    ratios_raw = raw.get("ratios", {})
    if not isinstance(ratios_raw, dict):
        errors.add(f"{path}.ratios", "must be an object")
        ratios_raw = {}
    for name, ratio in ratios_raw.items():
        if name not in SCALAR_NAMES:
            errors.add(f"{path}.ratios.{name}", f"unknown scalar (one of {', '.join(SCALAR_NAMES)})")
        elif isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 100:
            errors.add(f"{path}.ratios.{name}", "must be a number above 0 and at most 100")
        else:
            ratios[name] = float(ratio)
    report = None
    if "report" in raw:
        try:
            report = report_parse(data=raw["report"], prefix=f"{path}.report.")
        except InvalidInput as exc:
            errors.items.extend(exc.details)
        if report is not None and hostname is not None and report.hostname != hostname:
            errors.add(f"{path}.report.hostname", f"must equal the node's hostname {hostname}")
    if hostname is None or pool_key is None or any(v is None for k, v in fields.items() if k != "owner_id"):
        return None
    return NodeSpec(hostname, pool_key, fields, taints, ratios, report)


def fleet_parse(*, data: Any) -> FleetSpec:
    """Validate a whole fleet document; raise `InvalidInput` naming every bad field by its path."""
    errors = _Errors()
    spec = FleetSpec()
    if not _check_keys(errors, "fleet", data, set(), {"tenants", "pools", "nodes"}):
        raise InvalidInput("a fleet file is a JSON object", errors.items)
    for name in ("tenants", "pools", "nodes"):
        if not isinstance(data.get(name, []), list):
            errors.add(name, "must be a list")
    if errors.items:
        raise InvalidInput(f"{errors.items[0]['field']}: {errors.items[0]['message']}", errors.items)

    for i, raw in enumerate(data.get("tenants", [])):
        path = f"tenants[{i}]"
        if not _check_keys(errors, path, raw, {"id"}, {"name"}):
            continue
        tenant_id = _match(errors, f"{path}.id", raw.get("id"), TENANT_RE)
        name = raw.get("name", tenant_id or "")
        if not isinstance(name, str) or len(name) > 200:
            errors.add(f"{path}.name", "must be a string of at most 200 characters")
        elif tenant_id is not None:
            if tenant_id in spec.tenants:
                errors.add(f"{path}.id", f"duplicate tenant {tenant_id}")
            spec.tenants[tenant_id] = name

    by_name: dict[str, list[str]] = {}
    for i, raw in enumerate(data.get("pools", [])):
        pool = _parse_pool(errors, f"pools[{i}]", raw, spec.tenants)
        if pool is None:
            continue
        if pool.key in {p.key for p in spec.pools}:
            errors.add(f"pools[{i}].name", f"duplicate pool {pool.key}")
            continue
        spec.pools.append(pool)
        by_name.setdefault(pool.name, []).append(pool.key)

    hostnames: set[str] = set()
    uids: dict[str, str] = {}
    for i, raw in enumerate(data.get("nodes", [])):
        node = _parse_node(errors, f"nodes[{i}]", raw, by_name, spec.tenants)
        if node is None:
            continue
        if node.hostname in hostnames:
            errors.add(f"nodes[{i}].hostname", f"duplicate hostname {node.hostname}")
            continue
        hostnames.add(node.hostname)
        for k, gpu in enumerate(node.report.gpus if node.report else ()):
            if gpu.uuid in uids:
                errors.add(f"nodes[{i}].report.gpus[{k}].uuid", f"GPU {gpu.uuid} also on {uids[gpu.uuid]}")
            uids[gpu.uuid] = node.hostname
        spec.nodes.append(node)

    if errors.items:
        first = errors.items[0]
        more = f" (and {len(errors.items) - 1} more)" if len(errors.items) > 1 else ""
        raise InvalidInput(f"{first['field']}: {first['message']}{more}", errors.items)
    return spec


Progress = Callable[[int, int], None]


def fleet_load(
    *, data: Any, actor: str = "fleet-loader", progress: Progress | None = None
) -> dict[str, dict[str, str]]:
    """Load a fleet document (validated whole first) in one transaction; return the ids.

    Idempotent: tenants, pools, offerings, quotas, nodes, taints and devices are
    upserted by their natural keys. Quotas keep their `used`; a `max` below the
    current `used` is raised to `used` (the CHECK allows nothing less, and refusing
    would make a reload fail while workloads run). Records absent from the file are
    left alone: a fleet file adds and updates, it never deletes.
    """
    spec = fleet_parse(data=data)
    with transaction.atomic():
        Tenant.objects.bulk_create(
            [Tenant(id=tid, name=name) for tid, name in spec.tenants.items()],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["name"],
        )
        pool_ids = _load_pools(spec.pools)
        node_ids = _load_nodes(spec.nodes, pool_ids, actor=actor, progress=progress)
    return {"pools": pool_ids, "nodes": node_ids}


def _load_pools(pools: list[PoolSpec]) -> dict[str, str]:
    pool_ids: dict[str, str] = {}
    for spec in pools:
        pool, _ = Pool.objects.get_or_create(
            owner_id=spec.owner,
            name=spec.name,
            defaults={"sharing": spec.sharing, "slots_per_gpu": spec.slots_per_gpu},
        )
        Pool.objects.filter(pk=pool.pk).update(
            gpu_model=spec.gpu_model,
            sharing=spec.sharing,
            slots_per_gpu=spec.slots_per_gpu,
            notice_seconds=spec.notice_seconds,
        )
        # Archive keeps the first archive time, so a reload does not move it.
        if spec.archived:
            Pool.objects.filter(pk=pool.pk, archived_at__isnull=True).update(archived_at=_now())
        else:
            Pool.objects.filter(pk=pool.pk).update(archived_at=None)
        pool_ids[spec.key] = pool.pk
        for tenant, quota in spec.offers.items():
            Offering.objects.get_or_create(pool_id=pool.pk, tenant_id=tenant)
            for resource, limit in quota.items():
                QuotaUsage.objects.get_or_create(
                    pool_id=pool.pk, tenant_id=tenant, resource=resource, defaults={"max": limit}
                )
                with connection.cursor() as cursor:
                    cursor.execute(
                        "UPDATE quota_usage SET max = GREATEST(%s, used)"
                        " WHERE pool_id = %s AND tenant_id = %s AND resource = %s",
                        [limit, pool.pk, tenant, resource],
                    )
    return pool_ids


def _now() -> Func:
    return Func(function="compute_now")


def _load_nodes(
    nodes: list[NodeSpec], pool_ids: dict[str, str], *, actor: str, progress: Progress | None
) -> dict[str, str]:
    node_ids: dict[str, str] = {}
    done = 0
    for start in range(0, len(nodes), BATCH_NODES):
        batch = nodes[start : start + BATCH_NODES]
        rows = [
            Node(
                hostname=spec.hostname,
                pool_id=pool_ids[spec.pool],
                noschedule_taints=sum(1 for t in spec.taints if t["effect"] == TaintEffect.NO_SCHEDULE),
                cordon_reason="fleet file" if spec.fields["cordoned"] else "",
                cordoned_by="fleet-loader" if spec.fields["cordoned"] else "",
                maintenance_reason="fleet file" if spec.fields["maintenance"] else "",
                **spec.fields,
            )
            for spec in batch
        ]
        Node.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["hostname"],
            update_fields=["pool", *NODE_REGISTRATION_FIELDS, "noschedule_taints", "updated_at"],
        )
        by_host = {n.hostname: n for n in Node.objects.filter(hostname__in=[s.hostname for s in batch])}
        hosts = list(by_host)
        Node.objects.filter(hostname__in=hosts, cordoned=True, cordoned_at__isnull=True).update(
            cordoned_at=_now()
        )
        Node.objects.filter(hostname__in=hosts, cordoned=False, cordoned_at__isnull=False).update(
            cordoned_at=None
        )
        Node.objects.filter(hostname__in=hosts, connectivity=Connectivity.CONNECTED).update(
            last_heartbeat_at=_now()
        )
        _load_taints(batch, by_host)
        inventory_apply_reports(
            items=[(by_host[s.hostname], s.report) for s in batch if s.report is not None],
            actor=actor,
            ratios={by_host[s.hostname].pk: s.ratios for s in batch},
            connect=False,
        )
        for spec in batch:
            node_ids[spec.hostname] = by_host[spec.hostname].pk
        done += len(batch)
        if progress is not None:
            progress(done, len(nodes))
    return node_ids


def _load_taints(batch: list[NodeSpec], by_host: dict[str, Node]) -> None:
    """The file's taints become the node's taints: upserted by (node, key), others removed."""
    node_pks = [by_host[s.hostname].pk for s in batch]
    wanted = {(by_host[s.hostname].pk, t["key"]) for s in batch for t in s.taints}
    stale = [
        pk
        for pk, node_id, key in Taint.objects.filter(node_id__in=node_pks).values_list("pk", "node_id", "key")
        if (node_id, key) not in wanted
    ]
    if stale:
        Taint.objects.filter(pk__in=stale).delete()
    rows = [
        Taint(
            node_id=by_host[s.hostname].pk,
            key=t["key"],
            value=t["value"],
            effect=t["effect"],
            reason=t["reason"],
            created_by="fleet-loader",
        )
        for s in batch
        for t in s.taints
    ]
    if rows:
        Taint.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["node", "key"],
            update_fields=["value", "effect", "reason"],
        )


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
