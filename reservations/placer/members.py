"""A node's share of an option: which of its free atoms a request takes there.

The plan (`plan.py`) ranks nodes in SQL; choosing the atoms on a ranked node
is Python's part, done when an option is first asked for.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from reservations.placer.filters import item_topology
from reservations.request.types import ReservationRequest


def tie(value: Any, salt: int) -> bytes:
    """An order among equally good atoms that is random per plan and fixed within it.

    The Python side of the plan's seeded hash (`plan._tie_sql`): two concurrent
    plans that pick the same node usually pick different atoms of it.
    """
    return hashlib.blake2b(f"{salt}:{value}".encode(), digest_size=8).digest()


@dataclass(frozen=True)
class Member:
    """One node of an option and the atoms it would book there."""

    node_id: str
    device_ids: tuple[int, ...]
    atoms: tuple[str, ...]
    classes: tuple[str, ...]
    score: float
    displaced: int = 0
    # For a member of one atom: the node's other free atoms of that class, best
    # first (device id, uid). The commit may take one of them instead when a
    # concurrent placement holds the planned one (`option._lock_member`).
    alternates: tuple[tuple[int, str], ...] = ()


def item_atoms_choose(
    rows: list[dict[str, Any]], count: int, nvlink_all: bool, salt: int
) -> list[dict[str, Any]] | None:
    """Pick `count` atoms on one node: one NVLink domain if asked, one NUMA node when possible.

    Free atoms come before spot-booked ones; among NUMA nodes that can hold
    the whole count the fullest-fitting (fewest free) is chosen, keeping large
    groups whole for later requests. Between equally good NUMA nodes and atoms
    the order comes from the plan's `salt`, so two concurrent plans that pick
    the same node usually pick different atoms of it.
    """
    if len(rows) < count:
        return None
    pools: list[list[dict[str, Any]]] = [rows]
    if nvlink_all:
        by_domain: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if row["nvl"] is not None:
                by_domain[row["nvl"]].append(row)
        pools = [group for group in by_domain.values() if len(group) >= count]
        if not pools:
            return None
        pools.sort(key=lambda g: (sum(1 for r in g if r["displaced"]), len(g), g[0]["nvl"]))
    candidates = pools[0]
    by_numa: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in candidates:
        by_numa[row["numa"]].append(row)
    for group in by_numa.values():
        group.sort(key=lambda r: (r["displaced"], tie(r["uid"], salt), r["uid"]))
    fitting = [g for g in by_numa.values() if len(g) >= count]
    if fitting:
        fitting.sort(
            key=lambda g: (sum(1 for r in g[:count] if r["displaced"]), len(g), tie(g[0]["numa"], salt))
        )
        return fitting[0][:count]
    # No single NUMA node holds it: take from the largest groups first.
    chosen: list[dict[str, Any]] = []
    for group in sorted(by_numa.values(), key=lambda g: -len(g)):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


def member_choose(
    *,
    request: ReservationRequest,
    node_id: str,
    score: float,
    rows: list[dict[str, Any]],
    whole: list[dict[str, Any]],
    salt: int,
) -> Member | None:
    """The member a ranked node makes, from its free atoms `rows`; None when they cannot hold the request.

    Each device item takes its atoms apart from the items before it (two items
    may not share an atom); a whole-node lease takes `whole`, every bookable atom.
    """
    taken: set[int] = set()
    chosen: list[dict[str, Any]] = []
    for index, item in enumerate(request.devices):
        available = [r for r in rows if r["item"] == index and r["device_id"] not in taken]
        picked = item_atoms_choose(available, item.count, item_topology(request, item) == "nvlink-all", salt)
        if picked is None:
            return None  # two items competing for the same atoms on this node
        taken.update(r["device_id"] for r in picked)
        chosen.extend(picked)
    if request.binding == "node":
        # A whole-node lease books every bookable atom, the `node` atom included.
        chosen = sorted(whole, key=lambda r: (r["device_class"], r["uid"]))
    alternates: tuple[tuple[int, str], ...] = ()
    if len(chosen) == 1 and request.binding != "node" and not chosen[0]["displaced"]:
        # One atom: any other free one of the same class on the node serves the
        # request as well (one atom is on one NUMA node and one NVLink domain).
        same = [
            r
            for r in rows
            if r["device_class"] == chosen[0]["device_class"]
            and r["device_id"] != chosen[0]["device_id"]
            and not r["displaced"]
        ]
        same.sort(key=lambda r: (tie(r["uid"], salt), r["uid"]))
        alternates = tuple((r["device_id"], r["uid"]) for r in same)
    return Member(
        node_id=node_id,
        device_ids=tuple(r["device_id"] for r in chosen),
        atoms=tuple(r["uid"] for r in chosen),
        classes=tuple(r["device_class"] for r in chosen),
        score=float(score),
        displaced=sum(1 for r in chosen if r["displaced"]),
        alternates=alternates,
    )
