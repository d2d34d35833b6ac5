"""A fleet file's maintenance windows: `"maintenance": [{"nodes", "from", "to", "reason"}]`.

Nodes are named by hostname, as everywhere in a fleet file, and must be
declared in the same file; times are ISO-8601 with a zone (`2030-01-07T06:00:00Z`),
since a file is loaded on servers in any zone and must mean one instant.

Loading goes through `reservations.maintenance.services.maintenance_schedule`,
so a window from a file holds its atoms, repairs what is inside it and is
audited like one booked over HTTP. A window is the file's when a window of the
same nodes, `from` and reason exists in any state: it is then left as it is (an
operator may have shortened, extended or cancelled it; the file does not undo
that), so a reload schedules nothing twice. A window whose `to` has passed is
skipped: a file plans downtime, it does not write history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.clock import compute_now
from core.json_input import text_problem
from reservations.maintenance.services import MAX_NODES, maintenance_schedule
from reservations.models import MaintenanceWindow

KEYS = {"nodes", "from", "to", "reason"}
REASON_MAX = 1000

AddError = Callable[[str, str], None]


@dataclass(frozen=True)
class WindowSpec:
    hostnames: tuple[str, ...]
    starts_at: datetime
    ends_at: datetime
    reason: str


def _instant(add: AddError, path: str, value: Any) -> datetime | None:
    if not isinstance(value, str):
        add(path, "must be an ISO-8601 time with a zone, e.g. 2030-01-07T06:00:00Z")
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        add(path, f"{value!r} is not an ISO-8601 time, e.g. 2030-01-07T06:00:00Z")
        return None
    if moment.tzinfo is None:
        add(path, "must name its zone (Z or an offset such as +02:00)")
        return None
    return moment


def _hostnames(add: AddError, path: str, value: Any, declared: set[str]) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value or len(value) > MAX_NODES:
        add(path, f"must be a list of 1 to {MAX_NODES} hostnames of this file's nodes")
        return None
    ok = True
    for k, hostname in enumerate(value):
        if not isinstance(hostname, str) or hostname not in declared:
            add(f"{path}[{k}]", f"{hostname!r} is not the hostname of a node in this file")
            ok = False
    if ok and len(set(value)) != len(value):
        add(path, "names a node twice")
        ok = False
    return tuple(sorted(value)) if ok else None


def _reason(add: AddError, path: str, value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value) > REASON_MAX:
        add(path, f"must be a non-empty string of at most {REASON_MAX} characters")
        return None
    problem = text_problem(value)
    if problem is not None:
        add(path, problem)
        return None
    return value.strip()


def windows_parse(add: AddError, raw: list[Any], declared: set[str]) -> list[WindowSpec]:
    """Each window checked; every problem reported through `add` by its path (`maintenance[1].to`)."""
    windows: list[WindowSpec] = []
    for i, item in enumerate(raw):
        path = f"maintenance[{i}]"
        if not isinstance(item, dict):
            add(path, "must be an object")
            continue
        for key in sorted(set(item) - KEYS, key=str):
            add(f"{path}.{key}", "unknown field")
        for key in sorted(KEYS - set(item)):
            add(f"{path}.{key}", "required")
        if not set(item) >= KEYS:
            continue
        hostnames = _hostnames(add, f"{path}.nodes", item["nodes"], declared)
        starts_at = _instant(add, f"{path}.from", item["from"])
        ends_at = _instant(add, f"{path}.to", item["to"])
        reason = _reason(add, f"{path}.reason", item["reason"])
        if starts_at is not None and ends_at is not None and ends_at <= starts_at:
            add(f"{path}.to", "must be after from")
            continue
        if hostnames is None or starts_at is None or ends_at is None or reason is None:
            continue
        windows.append(WindowSpec(hostnames=hostnames, starts_at=starts_at, ends_at=ends_at, reason=reason))
    return windows


def _existing(spec: WindowSpec, node_ids: list[str]) -> MaintenanceWindow | None:
    """The window a previous load (or an operator) made for this declaration: same nodes, from, reason."""
    for window in MaintenanceWindow.objects.filter(
        starts_at=spec.starts_at, reason=spec.reason
    ).prefetch_related("members"):
        if sorted(m.node_id for m in window.members.all()) == node_ids:
            return window
    return None


def windows_load(windows: list[WindowSpec], node_ids: dict[str, str], *, actor: str) -> dict[str, list[str]]:
    """Schedule each window not yet there; its id under `scheduled`, `found` or (ended) `past`.

    Runs inside the fleet's transaction: a window refused (another live window
    holds one of its nodes then: CONFLICT naming it) refuses the whole load.
    """
    outcome: dict[str, list[str]] = {"scheduled": [], "found": [], "past": []}
    now = compute_now()
    for i, spec in enumerate(windows):
        ids = sorted(node_ids[h] for h in spec.hostnames)
        existing = _existing(spec, ids)
        if existing is not None:
            outcome["found"].append(existing.pk)
        elif spec.ends_at <= now:
            outcome["past"].append(f"maintenance[{i}]")
        else:
            impact = maintenance_schedule(
                node_ids=ids, starts_at=spec.starts_at, ends_at=spec.ends_at, reason=spec.reason, actor=actor
            )
            outcome["scheduled"].append(impact.window.pk)
    return outcome
