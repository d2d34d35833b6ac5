"""Strict validation of a node report (what a node's agent sends) into typed dataclasses.

A report is refused whole: every bad field is collected and raised at once as
`InvalidInput`, whose `details` name each field by its path (`gpus[2].memoryMiB`),
so an agent or an operator fixing a fleet file sees every problem in one answer.
Nothing here touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core.constants import BLANKS
from core.errors import InvalidInput
from core.json_input import json_integer, printable_name, text_problem
from inventory.choices import SCALAR_RESOURCES

# Bounds are generous but finite: a number outside them is a broken agent, not real hardware.
MAX_SCALAR = 1 << 40
MAX_GPU_MEMORY_MIB = 1 << 22  # 4 TiB
MAX_NUMA_NODE = 255
MAX_LINK_GBPS = 10_000
MAX_DISK_GIB = 1 << 30
MAX_MIG_GI = 63
MAX_MIG_CI = 63
# SR-IOV NICs ship with at most 256 VFs per physical function (most with 64 or 127), and a
# node carries a handful of such NICs: a report beyond either is a broken or hostile agent,
# and refusing it at parse time keeps one report from writing tens of thousands of devices.
MAX_VFS_PER_NIC = 256
MAX_VFS_PER_NODE = 2048
SCALARS = SCALAR_RESOURCES
HEALTHY: tuple[str | None, bool] = (None, False)  # `_parse_health` of a healthy GPU: no reason, no hold

# Every pattern is matched whole (`fullmatch`): with `re.match`, `$` also matches before a
# final newline, and `"GPU-1\n"` would become a second device beside `"GPU-1"`.
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
# A GPU uuid or a device id becomes part of a uid (`<uuid>/gi1/ci0`), so no slash or blank.
IDENT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
PCI_RE = re.compile(r"^([0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
MIG_PROFILE_RE = re.compile(r"^[1-9][0-9]?(c\.[1-9][0-9]?)?g\.[0-9]+gb(\+[a-z0-9]+)?$")


@dataclass(frozen=True)
class MigInstance:
    gi: int
    ci: int
    profile: str
    memory_mib: int


@dataclass(frozen=True)
class GpuReport:
    uuid: str
    product: str
    model: str
    memory_mib: int
    numa_node: int | None = None
    pci_bus_id: str | None = None
    nvlink_domain: str | None = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    # What the node's agent saw wrong with the GPU (NVML cannot query it, retired pages,
    # a row-remap failure, a critical XID); None when it reported none.
    unhealthy_reason: str | None = None
    # `health.clears`: the node holds the GPU back for a cause it will see go away.
    unhealthy_clears: bool = False


@dataclass(frozen=True)
class NicReport:
    pf: str
    link_gbps: int | None
    numa_node: int | None
    vfs: tuple[str, ...]


@dataclass(frozen=True)
class DiskReport:
    id: str
    size_gib: int
    media: str | None


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    resources: dict[str, int] = field(default_factory=dict)
    gpus: tuple[GpuReport, ...] = ()
    nics: tuple[NicReport, ...] = ()
    disks: tuple[DiskReport, ...] = ()


# gpuModel from a product name. Checked in order; the first pattern that matches the
# product (vendor words removed, upper-cased) wins, so longer names come before their
# prefixes (GH200 before H200, L40S before L40, A100 before A10).
_MODEL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), model)
    for pattern, model in (
        (r"\bRTX\s+PRO\s+(\d{4})\b", "RTXPRO{0}"),
        (r"\bRTX\s+(\d{4})\s+ADA\b", "RTX{0}Ada"),
        (r"\bRTX\s+A(\d{4})\b", "A{0}"),
    )
)
_MODEL_TOKEN_RE = re.compile(r"^(G[HB]\d{3}|[A-Z]{1,2}\d{1,4}[A-Z]{0,3})")
_VENDOR_WORDS = {"NVIDIA", "TESLA", "QUADRO", "GEFORCE", "AMD", "INSTINCT", "RADEON"}


def gpu_model_from_product(product: str) -> str:
    """The `gpuModel` a product name denotes: the family, without form factor or memory size.

    The rule, applied to the product as `nvidia-smi` prints it:

    1. Drop vendor and brand words (`NVIDIA`, `Tesla`, `Quadro`, `GeForce`).
    2. Workstation names keep their generation: `RTX 6000 Ada Generation` → `RTX6000Ada`,
       `RTX A6000` → `A6000`, `RTX PRO 6000 Blackwell ...` → `RTXPRO6000`.
    3. Otherwise the first word, cut at the first `-`, is the model when it looks like one
       (letters then digits then at most three letters): `H100 80GB HBM3` → `H100`,
       `A100-SXM4-80GB` → `A100`, `GH200 480GB` → `GH200`, `L40S` → `L40S`, `A10G` → `A10G`,
       `MI300X` → `MI300X`.
    4. Anything else: the first word, upper-cased, so an unknown product still groups by
       something stable rather than failing the report.
    """
    words = [w for w in product.strip().upper().split() if w not in _VENDOR_WORDS]
    rest = " ".join(words)
    for pattern, template in _MODEL_PATTERNS:
        match = pattern.search(rest)
        if match:
            return template.format(*match.groups())
    if not words:
        return "UNKNOWN"
    first = words[0].split("-")[0]
    match = _MODEL_TOKEN_RE.match(first)
    return match.group(1) if match else first


class _Errors:
    """Collects every bad field with its path; raised once at the end."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: list[dict[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append({"field": f"{self.prefix}{path}", "message": message})

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            more = f" (and {len(self.items) - 1} more)" if len(self.items) > 1 else ""
            raise InvalidInput(f"invalid node report: {first['field']}: {first['message']}{more}", self.items)


def _obj(
    errors: _Errors, path: str, value: Any, required: set[str], optional: set[str]
) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        errors.add(path, "must be an object")
        return None
    for key in value:
        if key not in required and key not in optional:
            problem = text_problem(key) if isinstance(key, str) else None
            name = printable_name(key) if isinstance(key, str) else str(key)
            errors.add(_join(path, name), f"field name {problem}" if problem else "unknown field")
    for key in sorted(required):
        if key not in value:
            errors.add(_join(path, key), "required")
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _int(errors: _Errors, path: str, value: Any, lo: int, hi: int) -> int | None:
    # bool is an int in Python; a report saying `true` for a size is broken. 80.0 is 80, as in
    # JSON Schema.
    number = json_integer(value)
    if number is None:
        errors.add(path, "must be an integer")
        return None
    value = number
    if not lo <= value <= hi:
        errors.add(path, f"must be between {lo} and {hi}")
        return None
    return value


def _str(errors: _Errors, path: str, value: Any, pattern: re.Pattern[str] | None = None) -> str | None:
    if not isinstance(value, str) or not value.strip():
        errors.add(path, "must be a non-empty string")
        return None
    if len(value) > 255:
        errors.add(path, "must be at most 255 characters")
        return None
    problem = text_problem(value)
    if problem is not None:
        errors.add(path, problem)
        return None
    if pattern is not None and not pattern.fullmatch(value):
        errors.add(path, f"does not match {pattern.pattern}")
        return None
    return value


def _list(errors: _Errors, path: str, value: Any, max_items: int = 4096) -> list[Any]:
    if not isinstance(value, list):
        errors.add(path, "must be a list")
        return []
    if len(value) > max_items:
        errors.add(path, f"must have at most {max_items} items")
        return []
    return value


def _parse_gpu(errors: _Errors, path: str, raw: Any) -> GpuReport | None:
    obj = _obj(
        errors,
        path,
        raw,
        {"uuid", "product", "memoryMiB"},
        {"model", "numaNode", "pciBusId", "nvlinkDomain", "mig", "health"},
    )
    if obj is None:
        return None
    uuid = _str(errors, f"{path}.uuid", obj.get("uuid"), IDENT_RE) if "uuid" in obj else None
    product = _str(errors, f"{path}.product", obj.get("product")) if "product" in obj else None
    memory = (
        _int(errors, f"{path}.memoryMiB", obj.get("memoryMiB"), 1, MAX_GPU_MEMORY_MIB)
        if "memoryMiB" in obj
        else None
    )
    model = _str(errors, f"{path}.model", obj["model"], IDENT_RE) if "model" in obj else None
    numa = _int(errors, f"{path}.numaNode", obj["numaNode"], 0, MAX_NUMA_NODE) if "numaNode" in obj else None
    pci = _str(errors, f"{path}.pciBusId", obj["pciBusId"], PCI_RE) if "pciBusId" in obj else None
    nvl = (
        _str(errors, f"{path}.nvlinkDomain", obj["nvlinkDomain"], IDENT_RE) if "nvlinkDomain" in obj else None
    )
    mig_enabled = False
    instances: list[MigInstance] = []
    if "mig" in obj:
        mig = _obj(errors, f"{path}.mig", obj["mig"], {"enabled"}, {"instances"})
        if mig is not None:
            enabled = mig.get("enabled")
            if "enabled" in mig and not isinstance(enabled, bool):
                errors.add(f"{path}.mig.enabled", "must be a boolean")
            mig_enabled = enabled is True
            seen: set[tuple[int, int]] = set()
            for i, inst in enumerate(_list(errors, f"{path}.mig.instances", mig.get("instances", []), 64)):
                ipath = f"{path}.mig.instances[{i}]"
                io = _obj(errors, ipath, inst, {"gi", "ci", "profile", "memoryMiB"}, set())
                if io is None:
                    continue
                gi = _int(errors, f"{ipath}.gi", io.get("gi"), 0, MAX_MIG_GI) if "gi" in io else None
                ci = _int(errors, f"{ipath}.ci", io.get("ci"), 0, MAX_MIG_CI) if "ci" in io else None
                profile = (
                    _str(errors, f"{ipath}.profile", io.get("profile"), MIG_PROFILE_RE)
                    if "profile" in io
                    else None
                )
                imem = (
                    _int(errors, f"{ipath}.memoryMiB", io.get("memoryMiB"), 1, MAX_GPU_MEMORY_MIB)
                    if "memoryMiB" in io
                    else None
                )
                if gi is None or ci is None or profile is None or imem is None:
                    continue
                if (gi, ci) in seen:
                    errors.add(ipath, f"duplicate MIG instance gi{gi}/ci{ci}")
                    continue
                if memory is not None and imem > memory:
                    errors.add(f"{ipath}.memoryMiB", "exceeds the GPU's memoryMiB")
                    continue
                seen.add((gi, ci))
                instances.append(MigInstance(gi=gi, ci=ci, profile=profile, memory_mib=imem))
            if instances and not mig_enabled:
                errors.add(f"{path}.mig.instances", "must be empty when MIG is not enabled")
    unhealthy, clears = _parse_health(errors, f"{path}.health", obj["health"]) if "health" in obj else HEALTHY
    if uuid is None or product is None or memory is None:
        return None
    return GpuReport(
        uuid=uuid,
        product=product,
        model=model or gpu_model_from_product(product),
        memory_mib=memory,
        numa_node=numa,
        pci_bus_id=pci,
        nvlink_domain=nvl,
        mig_enabled=mig_enabled,
        mig_instances=tuple(sorted(instances, key=lambda m: (m.gi, m.ci))),
        unhealthy_reason=unhealthy,
        unhealthy_clears=clears,
    )


def _parse_health(errors: _Errors, path: str, raw: Any) -> tuple[str | None, bool]:
    """`{"healthy": false, "reason", "clears"}`: the reason (or a default) and `clears`, else HEALTHY."""
    health = _obj(errors, path, raw, {"healthy"}, {"reason", "clears"})
    if health is None or "healthy" not in health:
        return HEALTHY
    if not isinstance(health.get("clears", False), bool):
        errors.add(f"{path}.clears", "must be a boolean")
    if not isinstance(health["healthy"], bool):
        errors.add(f"{path}.healthy", "must be a boolean")
        return HEALTHY
    reason = _str(errors, f"{path}.reason", health["reason"]) if "reason" in health else None
    if health["healthy"]:
        return HEALTHY
    return reason or "reported unhealthy by the node", health.get("clears") is True


def _parse_nic(errors: _Errors, path: str, raw: Any) -> NicReport | None:
    obj = _obj(errors, path, raw, {"pf"}, {"linkGbps", "numaNode", "vfs"})
    if obj is None:
        return None
    pf = _str(errors, f"{path}.pf", obj.get("pf"), IDENT_RE) if "pf" in obj else None
    link = _int(errors, f"{path}.linkGbps", obj["linkGbps"], 1, MAX_LINK_GBPS) if "linkGbps" in obj else None
    numa = _int(errors, f"{path}.numaNode", obj["numaNode"], 0, MAX_NUMA_NODE) if "numaNode" in obj else None
    vfs: list[str] = []
    for i, vf in enumerate(_list(errors, f"{path}.vfs", obj.get("vfs", []), MAX_VFS_PER_NIC)):
        value = _str(errors, f"{path}.vfs[{i}]", vf, PCI_RE)
        if value is not None:
            vfs.append(value)
    if pf is None:
        return None
    return NicReport(pf=pf, link_gbps=link, numa_node=numa, vfs=tuple(vfs))


def _parse_disk(errors: _Errors, path: str, raw: Any) -> DiskReport | None:
    obj = _obj(errors, path, raw, {"id", "sizeGiB"}, {"media"})
    if obj is None:
        return None
    disk_id = _str(errors, f"{path}.id", obj.get("id"), IDENT_RE) if "id" in obj else None
    size = _int(errors, f"{path}.sizeGiB", obj.get("sizeGiB"), 0, MAX_DISK_GIB) if "sizeGiB" in obj else None
    media = _str(errors, f"{path}.media", obj["media"], IDENT_RE) if "media" in obj else None
    if disk_id is None or size is None:
        return None
    return DiskReport(id=disk_id, size_gib=size, media=media)


_Item = TypeVar("_Item", GpuReport, DiskReport)


def _parse_unique(
    errors: _Errors,
    obj: dict[str, Any],
    name: str,
    max_items: int,
    parse: Callable[[_Errors, str, Any], _Item | None],
    *,
    key: str,
    noun: str,
) -> list[_Item]:
    """The report's list `name`, each item parsed; an item whose `key` repeats an earlier one's is refused."""
    items: list[_Item] = []
    seen: set[str] = set()
    for i, raw in enumerate(_list(errors, name, obj.get(name, []), max_items)):
        item = parse(errors, f"{name}[{i}]", raw)
        if item is None:
            continue
        value = getattr(item, key)
        if value in seen:
            errors.add(f"{name}[{i}].{key}", f"duplicate {noun} {value}")
            continue
        seen.add(value)
        items.append(item)
    return items


def report_parse(*, data: Any, prefix: str = "") -> NodeReport:
    """Validate a node report and return it typed, or raise `InvalidInput` naming every bad field.

    `prefix` is prepended to every field path, so a fleet file names
    `nodes[3].report.gpus[2].memoryMiB` rather than `gpus[2].memoryMiB`.
    """
    errors = _Errors(prefix)
    obj = _obj(errors, "", data, {"hostname"}, {"resources", "gpus", "nics", "disks"})
    if obj is None:
        errors.raise_if_any()
        raise AssertionError("unreachable")
    hostname = _str(errors, "hostname", obj.get("hostname"), HOSTNAME_RE) if "hostname" in obj else None

    resources: dict[str, int] = {}
    if "resources" in obj:
        res = _obj(errors, "resources", obj["resources"], set(), set(SCALARS))
        for key in SCALARS:
            if res is not None and key in res:
                value = _int(errors, f"resources.{key}", res[key], 0, MAX_SCALAR)
                if value is not None:
                    resources[key] = value

    gpus = _parse_unique(errors, obj, "gpus", 64, _parse_gpu, key="uuid", noun="GPU uuid")

    nics: list[NicReport] = []
    vf_seen: set[str] = set()
    vf_count = 0
    for i, raw in enumerate(_list(errors, "nics", obj.get("nics", []), 64)):
        nic = _parse_nic(errors, f"nics[{i}]", raw)
        if nic is None:
            continue
        vf_count += len(nic.vfs)
        if vf_count > MAX_VFS_PER_NODE:
            errors.add(f"nics[{i}].vfs", f"a node has at most {MAX_VFS_PER_NODE} VFs in all")
            break
        for k, vf in enumerate(nic.vfs):
            if vf.lower() in vf_seen:
                errors.add(f"nics[{i}].vfs[{k}]", f"duplicate VF address {vf}")
            vf_seen.add(vf.lower())
        nics.append(nic)

    disks = _parse_unique(errors, obj, "disks", 256, _parse_disk, key="id", noun="disk id")

    errors.raise_if_any()
    assert hostname is not None
    return NodeReport(
        hostname=hostname, resources=resources, gpus=tuple(gpus), nics=tuple(nics), disks=tuple(disks)
    )


# --- The report's JSON Schema (the `inventory/report` method's document) -------------------

# A free text field (`product`): at most 255 characters, no NUL, something besides the blanks
# `str.strip` removes (spelled out, as ECMA-262's `\s` is not Python's: `core.constants.BLANKS`).
_TEXT_PATTERN = f"^[^\\u0000]*[^\\u0000{BLANKS}][^\\u0000]*$"
_CLEARS = {"type": "boolean", "description": "true: the node lifts the mark itself once its cause is gone"}


def _string(pattern: re.Pattern[str] | None = None) -> dict[str, Any]:
    return {"type": "string", "maxLength": 255, "pattern": pattern.pattern if pattern else _TEXT_PATTERN}


def _integer(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "additionalProperties": False,
    }
    if required:
        schema["required"] = sorted(required)
    return schema


def _array(items: dict[str, Any], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": max_items}


def report_schema() -> dict[str, Any]:
    """What `report_parse` takes, as a JSON Schema; the rules across items (no uuid twice, a MIG
    instance within its GPU's memory) are the method's rules, not the schema's."""
    mig_instance = _object(
        {
            "gi": _integer(0, MAX_MIG_GI),
            "ci": _integer(0, MAX_MIG_CI),
            "profile": _string(MIG_PROFILE_RE),
            "memoryMiB": _integer(1, MAX_GPU_MEMORY_MIB),
        }
    )
    gpu = _object(
        {"uuid": _string(IDENT_RE), "product": _string(), "memoryMiB": _integer(1, MAX_GPU_MEMORY_MIB)},
        {
            "model": _string(IDENT_RE),
            "numaNode": _integer(0, MAX_NUMA_NODE),
            "pciBusId": _string(PCI_RE),
            "nvlinkDomain": _string(IDENT_RE),
            "mig": _object({"enabled": {"type": "boolean"}}, {"instances": _array(mig_instance, 64)}),
            "health": _object({"healthy": {"type": "boolean"}}, {"reason": _string(), "clears": _CLEARS}),
        },
    )
    nic = _object(
        {"pf": _string(IDENT_RE)},
        {
            "linkGbps": _integer(1, MAX_LINK_GBPS),
            "numaNode": _integer(0, MAX_NUMA_NODE),
            "vfs": _array(_string(PCI_RE), MAX_VFS_PER_NIC),
        },
    )
    disk = _object(
        {"id": _string(IDENT_RE), "sizeGiB": _integer(0, MAX_DISK_GIB)}, {"media": _string(IDENT_RE)}
    )
    report = _object(
        {"hostname": _string(HOSTNAME_RE)},
        {
            "resources": _object({}, {key: _integer(0, MAX_SCALAR) for key in SCALARS}),
            "gpus": _array(gpu, 64),
            "nics": _array(nic, 64),
            "disks": _array(disk, 256),
        },
    )
    report["description"] = "A node's hardware, as its agent sees it (fleet.md's node report)"
    return report
