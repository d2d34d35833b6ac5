"""Fleet files: one JSON document of tenants, pools, offerings and nodes with their reports.

`fleet_parse` validates the whole document (every node's report included) before
anything is written, so a bad file is refused whole with the path of each bad
field (`nodes[3].report.gpus[2].memoryMiB`); `fleets.load` then writes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.json_input import printable_name, text_problem
from fleets.maintenance import WindowSpec, windows_parse
from inventory.choices import (
    ALL_RESOURCES,
    SLOT_SHARING,
    Connectivity,
    ProvisionState,
    Role,
    ScalarResource,
    Sharing,
    TaintEffect,
    Trust,
)
from inventory.reports import HOSTNAME_RE, NodeReport, report_parse
from inventory.services.nodes import TAINT_KEY_RE
from ledger.models import QuotaMode

# Patterns are matched whole (`fullmatch`), so a trailing newline never passes for `$`.
TENANT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
POOL_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
QUOTA_RESOURCES = ALL_RESOURCES
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
    # tenant -> the mode of that offering's quota rows, when the file names one
    quota_modes: dict[str, str] = field(default_factory=dict)

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
    maintenance: list[WindowSpec] = field(default_factory=list)


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
            errors.add(f"{path}.{_name(key)}", "unknown field")
    for key in sorted(required - set(value)):
        errors.add(f"{path}.{key}", "required")
    return True


def _name(key: Any) -> str:
    """A key as an error's field path may echo it: NUL and surrogates written as `\\uXXXX`."""
    return printable_name(key) if isinstance(key, str) else str(key)


def _text_ok(errors: _Errors, path: str, value: str) -> bool:
    """A free-text string (a name, a label, a reason) holds no NUL and no unpaired surrogate."""
    problem = text_problem(value)
    if problem is not None:
        errors.add(path, problem)
    return problem is None


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
    if not isinstance(value, str) or not pattern.fullmatch(value):
        errors.add(path, f"must match {pattern.pattern}")
        return None
    return value


def _known_items(
    errors: _Errors, path: str, value: Any, names: Sequence[str], what: str
) -> Iterator[tuple[str, Any]]:
    """An object's entries whose key is one of `names`; a non-object and every other key are reported."""
    if not isinstance(value, dict):
        errors.add(path, "must be an object")
        return
    for key, item in value.items():
        if key not in names:
            errors.add(f"{path}.{_name(key)}", f"unknown {what} (one of {', '.join(names)})")
            continue
        yield key, item


def _parse_quota(errors: _Errors, path: str, value: Any) -> dict[str, int]:
    quota: dict[str, int] = {}
    for resource, limit in _known_items(errors, path, value, QUOTA_RESOURCES, "resource"):
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
    elif not _text_ok(errors, f"{path}.gpuModel", gpu_model):
        gpu_model = ""
    sharing = _choice(errors, f"{path}.sharing", raw.get("sharing", "exclusive"), list(Sharing.values))
    slots = None
    if sharing in SLOT_SHARING:
        slots = _int(errors, f"{path}.slotsPerGpu", raw.get("slotsPerGpu"), 1, 64)
    elif "slotsPerGpu" in raw:
        errors.add(f"{path}.slotsPerGpu", "only for timeslice or mps pools")
    notice = _int(errors, f"{path}.noticeSeconds", raw.get("noticeSeconds", 30), 0, 86400)
    archived = _bool(errors, f"{path}.archived", raw.get("archived", False))
    offers: dict[str, dict[str, int]] = {}
    quota_modes: dict[str, str] = {}
    offers_raw = raw.get("offers", [])
    if not isinstance(offers_raw, list):
        errors.add(f"{path}.offers", "must be a list")
        offers_raw = []
    for i, offer in enumerate(offers_raw):
        opath = f"{path}.offers[{i}]"
        if not _check_keys(errors, opath, offer, {"tenant"}, {"quota", "quotaMode"}):
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
            if "quotaMode" in offer:
                mode = _choice(errors, f"{opath}.quotaMode", offer["quotaMode"], list(QuotaMode.values))
                if mode is not None:
                    quota_modes[tenant] = mode
    if name is None or owner is None or sharing is None or notice is None:
        return None
    return PoolSpec(owner, name, gpu_model, sharing, slots, notice, archived, offers, quota_modes)


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
    pool_key = _node_pool(errors, f"{path}.pool", raw.get("pool"), pools)
    fields = _node_fields(errors, path, raw, tenants)
    taints = _parse_taints(errors, f"{path}.taints", raw.get("taints", []))
    ratios = _parse_ratios(errors, f"{path}.ratios", raw.get("ratios", {}))
    report = None
    if "report" in raw:
        report = _node_report(errors, f"{path}.report", raw["report"], hostname)
    if hostname is None or pool_key is None or any(v is None for k, v in fields.items() if k != "owner_id"):
        return None
    return NodeSpec(hostname, pool_key, fields, taints, ratios, report)


def _node_pool(errors: _Errors, path: str, pool_ref: Any, pools: dict[str, list[str]]) -> str | None:
    """The `owner/name` key of the node's pool: named so, or by a name only one owner uses."""
    if isinstance(pool_ref, str) and "/" in pool_ref:
        if pool_ref in {k for ks in pools.values() for k in ks}:
            return pool_ref
        errors.add(path, f"unknown pool {_name(pool_ref)}")
    elif isinstance(pool_ref, str):
        matches = pools.get(pool_ref, [])
        if len(matches) == 1:
            return matches[0]
        errors.add(
            path,
            f"unknown pool {_name(pool_ref)}"
            if not matches
            else f"ambiguous pool {pool_ref}: say owner/name",
        )
    else:
        errors.add(path, "must be a string")
    return None


def _node_fields(errors: _Errors, path: str, raw: dict[str, Any], tenants: dict[str, str]) -> dict[str, Any]:
    """The node row's own fields (None where one is bad), its owner and its labels."""
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
    fields["labels"] = _parse_labels(errors, f"{path}.labels", raw.get("labels", {}))
    return fields


def _parse_labels(errors: _Errors, path: str, labels: Any) -> dict[str, str]:
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k for k, v in labels.items()
    ):
        errors.add(path, "must be an object of strings")
        return {}
    if not all(_text_ok(errors, f"{path}.{_name(k)}", f"{k}{v}") for k, v in labels.items()):
        return {}
    return labels


def _parse_taints(errors: _Errors, path: str, taints_raw: Any) -> list[dict[str, str]]:
    """The node's taints; a bad one is reported and left out, a key taken twice refused."""
    taints: list[dict[str, str]] = []
    if not isinstance(taints_raw, list):
        errors.add(path, "must be a list")
        return taints
    keys: set[str] = set()
    for i, raw in enumerate(taints_raw):
        taint = _parse_taint(errors, f"{path}[{i}]", raw, keys)
        if taint is not None:
            taints.append(taint)
    return taints


def _parse_taint(errors: _Errors, tpath: str, taint: Any, keys: set[str]) -> dict[str, str] | None:
    """One taint; its key joins `keys` (the ones already taken) once it is well-formed."""
    if not _check_keys(errors, tpath, taint, {"key", "effect"}, {"value", "reason"}):
        return None
    key = taint.get("key")
    if not isinstance(key, str) or not key or len(key) > 253:
        errors.add(f"{tpath}.key", "must be a non-empty string")
        return None
    if not TAINT_KEY_RE.fullmatch(key):
        errors.add(f"{tpath}.key", "must be 1-253 letters, digits, '.', '_', '/' or '-'")
        return None
    if key in keys:
        errors.add(f"{tpath}.key", f"duplicate taint key {key}")
        return None
    keys.add(key)
    effect = _choice(errors, f"{tpath}.effect", taint.get("effect"), TAINT_EFFECTS)
    value = taint.get("value", "")
    reason = taint.get("reason", "")
    if not isinstance(value, str) or not isinstance(reason, str):
        errors.add(tpath, "value and reason must be strings")
        return None
    if not (_text_ok(errors, f"{tpath}.value", value) and _text_ok(errors, f"{tpath}.reason", reason)):
        return None
    if effect is None:
        return None
    return {"key": key, "value": value, "effect": effect, "reason": reason}


def _parse_ratios(errors: _Errors, path: str, value: Any) -> dict[str, float]:
    """Overcommit ratios by scalar name, each above 0 and at most 100."""
    ratios: dict[str, float] = {}
    for name, ratio in _known_items(errors, path, value, SCALAR_NAMES, "scalar"):
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 100:
            errors.add(f"{path}.{name}", "must be a number above 0 and at most 100")
        else:
            ratios[name] = float(ratio)
    return ratios


def _node_report(errors: _Errors, path: str, raw: Any, hostname: str | None) -> NodeReport | None:
    """The node's report, parsed as a node agent's would be, for the node's own hostname."""
    report = None
    try:
        report = report_parse(data=raw, prefix=f"{path}.")
    except InvalidInput as exc:
        errors.items.extend(exc.details)
    if report is not None and hostname is not None and report.hostname != hostname:
        errors.add(f"{path}.hostname", f"must equal the node's hostname {hostname}")
    return report


def fleet_parse(*, data: Any) -> FleetSpec:
    """Validate a whole fleet document; raise `InvalidInput` naming every bad field by its path."""
    errors = _Errors()
    spec = FleetSpec()
    if not _check_keys(errors, "fleet", data, set(), {"tenants", "pools", "nodes", "maintenance"}):
        raise InvalidInput("a fleet file is a JSON object", errors.items)
    for name in ("tenants", "pools", "nodes", "maintenance"):
        if not isinstance(data.get(name, []), list):
            errors.add(name, "must be a list")
    if errors.items:
        raise InvalidInput.from_details(errors.items)

    for i, raw in enumerate(data.get("tenants", [])):
        path = f"tenants[{i}]"
        if not _check_keys(errors, path, raw, {"id"}, {"name"}):
            continue
        tenant_id = _match(errors, f"{path}.id", raw.get("id"), TENANT_RE)
        name = raw.get("name", tenant_id or "")
        if not isinstance(name, str) or len(name) > 200:
            errors.add(f"{path}.name", "must be a string of at most 200 characters")
        elif not _text_ok(errors, f"{path}.name", name):
            pass
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
    spec.maintenance = windows_parse(errors.add, data.get("maintenance", []), hostnames)

    if errors.items:
        raise InvalidInput.from_details(errors.items, more=True)
    return spec


Progress = Callable[[int, int], None]
