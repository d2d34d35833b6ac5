"""Snapshot files: a host described by a JSON file instead of read live, and the writer of such files.

An operator runs the agent with `--snapshot FILE` on a host without NVML (or in a test
bed), and `snapshot_write` saves what a live read saw, to replay or ship it. A file is
checked on every read (types of the keys `source.py` documents; unknown keys are left
alone) so that a typo is one clear line rather than a broken report later.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from better_compute_agent.discovery.source import SNAPSHOT_VERSION, DiscoveryError, HostSource, Snapshot

# A key's allowed types; `None` in the tuple means null is allowed. Keys in the `required`
# set must be present; the others may be left out of a hand-written file.
_Spec = dict[str, tuple[Any, ...]]
_INT = (int,)
_OPT_INT = (int, None)
_OPT_STR = (str, None)

_TOP: _Spec = {
    "snapshotVersion": _INT,
    "hostname": (str,),
    "driverVersion": _OPT_STR,
    "host": (dict,),
    "gpus": (list,),
    "nics": (list,),
    "disks": (list,),
    "numa": (list,),
}
_NUMA: _Spec = {"node": _INT, "cpus": (str,), "distances": (list,)}
_HOST: _Spec = {"vcpu": _INT, "memoryGiB": _INT, "hugepages1Gi": _INT}
_GPU: _Spec = {
    "index": _INT,
    "uuid": _OPT_STR,
    "name": _OPT_STR,
    "memoryMiB": _OPT_INT,
    "pciBusId": _OPT_STR,
    "minor": _OPT_INT,
    "numaNode": _OPT_INT,
    "nvlinkDomain": _OPT_STR,
    "mig": (dict,),
    "health": (dict,),
    "processes": (list,),
}
_MIG: _Spec = {"enabled": (bool,), "instances": (list,)}
_INSTANCE: _Spec = {
    "gi": _INT,
    "ci": _INT,
    "profile": (str,),
    "memoryMiB": _INT,
    "uuid": _OPT_STR,
    "giCapDevice": _OPT_STR,
    "ciCapDevice": _OPT_STR,
}
_HEALTH: _Spec = {
    "retiredPagesPending": (bool,),
    "rowRemapFailure": (bool,),
    "xidEvents": (list,),
    "queryErrors": (list,),
}
_NIC: _Spec = {
    "pf": (str,),
    "pciAddress": _OPT_STR,
    "linkGbps": _OPT_INT,
    "numaNode": _OPT_INT,
    "vfs": (list,),
}
_DISK: _Spec = {"id": (str,), "sizeGiB": _INT, "media": _OPT_STR}
_TYPE_NAMES = {
    int: "an integer",
    str: "a string",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
    None: "null",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_ok(value: Any, allowed: tuple[Any, ...]) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):
        return bool in allowed
    return any(t is not None and isinstance(value, t) for t in allowed)


def _check(value: Any, spec: _Spec, required: set[str], path: str) -> str | None:
    """The first problem of one object against its spec, as `path.key: what is wrong`."""
    if not isinstance(value, dict):
        return f"{path or 'snapshot'}: must be an object"
    for key in sorted(required):
        if key not in value:
            return f"{path}{key}: required"
    for key, allowed in spec.items():
        if key in value and not _type_ok(value[key], allowed):
            return f"{path}{key}: must be {' or '.join(_TYPE_NAMES[t] for t in allowed)}"
    return None


def _check_list(items: list[Any], spec: _Spec, required: set[str], path: str) -> str | None:
    for i, item in enumerate(items):
        problem = _check(item, spec, required, f"{path}[{i}].")
        if problem:
            return problem
    return None


def _check_gpu(gpu: dict[str, Any], path: str) -> str | None:
    mig = gpu.get("mig", {"enabled": False})
    problem = _check(mig, _MIG, {"enabled"}, f"{path}mig.")
    if problem is None:
        problem = _check_list(
            mig.get("instances", []), _INSTANCE, {"gi", "ci", "profile", "memoryMiB"}, f"{path}mig.instances"
        )
    if problem is None:
        problem = _check(gpu.get("health", {}), _HEALTH, set(), f"{path}health.")
    if problem is None:
        health = gpu.get("health", {})
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in health.get("xidEvents", [])):
            problem = f"{path}health.xidEvents: must be a list of integers"
        elif not all(isinstance(x, str) for x in health.get("queryErrors", [])):
            problem = f"{path}health.queryErrors: must be a list of strings"
    return problem


def snapshot_problem(data: Any) -> str | None:
    """What is wrong with a snapshot, in one line, or None when it can be used."""
    problem = _check(data, _TOP, {"snapshotVersion", "hostname", "host", "gpus"}, "")
    if problem:
        return problem
    if data["snapshotVersion"] != SNAPSHOT_VERSION:
        version = data["snapshotVersion"]
        return f"snapshotVersion: {version} is not supported (this agent reads {SNAPSHOT_VERSION})"
    problem = _check(data["host"], _HOST, set(_HOST), "host.")
    if problem:
        return problem
    problem = _check_list(data["gpus"], _GPU, {"index", "uuid", "name", "memoryMiB"}, "gpus")
    for i, gpu in enumerate(data["gpus"]):
        problem = problem or _check_gpu(gpu, f"gpus[{i}].")
    problem = problem or _check_list(data.get("nics", []), _NIC, {"pf"}, "nics")
    for i, nic in enumerate(data.get("nics", [])):
        if problem is None and not all(isinstance(vf, str) for vf in nic.get("vfs", [])):
            problem = f"nics[{i}].vfs: must be a list of strings"
    problem = problem or _check_list(data.get("disks", []), _DISK, {"id", "sizeGiB"}, "disks")
    problem = problem or _check_list(data.get("numa", []), _NUMA, {"node", "cpus"}, "numa")
    for i, entry in enumerate(data.get("numa", [])):
        if problem is None and not re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", entry["cpus"]):
            problem = f"numa[{i}].cpus: must be a cpulist such as 0-27,56-83"
        if problem is None and not all(_is_int(d) for d in entry.get("distances", [])):
            problem = f"numa[{i}].distances: must be a list of integers"
    for i, gpu in enumerate(data["gpus"]):
        if problem is None and not all(_is_int(pid) for pid in gpu.get("processes", [])):
            problem = f"gpus[{i}].processes: must be a list of pids"
    return problem


class SnapshotSource(HostSource):
    """A host as a snapshot file describes it; the file is read afresh on every `read`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Snapshot:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DiscoveryError(f"snapshot {self.path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise DiscoveryError(f"snapshot {self.path}: cannot be read ({_one_line(exc)})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DiscoveryError(
                f"snapshot {self.path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            ) from None
        problem = snapshot_problem(data)
        if problem:
            raise DiscoveryError(f"snapshot {self.path}: {problem}")
        snapshot: Snapshot = data
        return snapshot

    def gpu_processes(self) -> dict[str, list[int]]:
        """What the file says uses each GPU (`gpus[].processes`): a test bed's stand-in for NVML."""
        snapshot = self.read()
        return {
            str(gpu["uuid"]): list(gpu.get("processes") or [])
            for gpu in snapshot["gpus"]
            if gpu.get("uuid") and gpu.get("processes")
        }


def snapshot_write(snapshot: Snapshot, path: Path) -> None:
    """Write `snapshot` to `path` whole or not at all: a reader never sees half a file."""
    path = Path(path)
    text = json.dumps(snapshot, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 is for secrets; a snapshot is not one
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
