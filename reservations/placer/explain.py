"""Why not: how many nodes of the pool each of the placer's filters removes, and why, node by node.

For a request starting at its window, every node of the pool (or one named
node) falls in exactly one class, the first filter that removes it, in the
order the placer applies them:

1. `notSchedulable`, by bucket (`maintenance`, `unreachable`, `unhealthy`
   for a `NoSchedule` taint, `provisioning`, `excluded`);
2. `scalars`: a scalar claim does not fit `floor(allocatable * ratio) - allocated`;
3. `selector`: fewer healthy atoms of an item's class match its selector than it asks;
4. `noFreeAtoms`: fewer of those are free for the whole window;
5. `topology`: `nvlink-all` finds no NVLink domain with enough free atoms,
   or a gang member lacks the gang's label;

and the rest `fit`. The counts add up to the nodes looked at. Up to
`SAMPLES` nodes per class come with the precise reason, in words that name
atoms, counts and times, never a booking or another tenant's reservation
(a maintenance window, which is the operators', is named: "held by
maintenance window 'firmware' on node_… from … to …").
One statement counts; one more per class with samples spells them out.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db import connection

from inventory.schedulability import SCHEDULABLE, bucket_sql
from reservations.maintenance.windows import window_phrase, windows_overlapping
from reservations.placer.filters import (
    Window,
    blocking_booking_sql,
    gang_key,
    item_topology,
    selector_sql,
    window_sql,
)
from reservations.placer.sql import Params
from reservations.request.types import ReservationRequest

SAMPLES = 10
# The classes in the order the filters run; `fit` last.
ORDER = ("notSchedulable", "scalars", "selector", "noFreeAtoms", "topology", "fit")


def _classify_sql(*, request: ReservationRequest, window: Window, node_id: str | None, q: Params) -> str:
    window_expr = window_sql(window, q)
    scalars = " AND ".join(
        "EXISTS (SELECT 1 FROM inventory_noderesource nr WHERE nr.node_id = n.id"
        f" AND nr.resource = {q.p(resource)}"
        f" AND floor(nr.allocatable * nr.ratio) - nr.allocated >= {q.p(amount, 'bigint')})"
        for resource, amount in sorted(request.resources.items())
        if amount and amount > 0
    )
    columns: list[str] = []
    joins: list[str] = []
    for index, item in enumerate(request.devices):
        busy = blocking_booking_sql(device="d", window_expr=window_expr, displace=False)
        matching = f"d.device_class = {q.p(item.device_class)} AND {selector_sql(item.selector, q)}"
        count = q.p(item.count, "int")
        if item_topology(request, item) == "nvlink-all":
            domains = (
                "(SELECT COALESCE(max(c), 0) FROM (SELECT count(*) AS c FROM inventory_device d"
                f" WHERE d.node_id = n.id AND d.bookable AND d.healthy AND {matching} AND NOT {busy}"
                " AND d.attributes ? 'nvlinkDomain' GROUP BY d.attributes ->> 'nvlinkDomain') g)"
            )
        else:
            domains = count
        # Per item, one pass over the node's healthy atoms: enough match, enough of those are free.
        columns.append(f"i{index}.matching AS match_{index}, i{index}.free AS free_{index}")
        columns.append(f"{domains} >= {count} AS nvl_{index}")
        joins.append(
            f" CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE {matching}) >= {count} AS matching,"
            f" count(*) FILTER (WHERE {matching} AND NOT {busy}) >= {count} AS free FROM inventory_device d"
            f" WHERE d.node_id = n.id AND d.bookable AND d.healthy) i{index}"
        )
    gang = f"n.labels ? {q.p(gang_key(request))}" if request.gang_size else "true"
    where = f"n.pool_id = {q.p(request.pool_id)}"
    if node_id is not None:
        where += f" AND n.id = {q.p(node_id)}"
    return (
        f"SELECT n.id, {bucket_sql('n', 'p.owner_id')} AS bucket, {scalars or 'true'} AS scalars_ok,"
        f" {gang} AS labelled, {', '.join(columns)}"
        f" FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id{''.join(joins)}"
        f" WHERE {where} ORDER BY n.id"
    )


def _classify(row: dict[str, Any], items: int) -> tuple[str, str | None]:
    """The first filter that removes this node, and the bucket when it is not schedulable."""
    if row["bucket"] != SCHEDULABLE:
        return "notSchedulable", row["bucket"]
    if not row["scalars_ok"]:
        return "scalars", None
    if not all(row[f"match_{i}"] for i in range(items)):
        return "selector", None
    if not all(row[f"free_{i}"] for i in range(items)):
        return "noFreeAtoms", None
    if not row["labelled"] or not all(row[f"nvl_{i}"] for i in range(items)):
        return "topology", None
    return "fit", None


def placement_explain(
    *, request: ReservationRequest, window: Window, node_id: str | None = None
) -> dict[str, Any]:
    """Per filter, how many of the pool's nodes (or the named node) it removes, with samples and reasons."""
    q = Params()
    sql = _classify_sql(request=request, window=window, node_id=node_id, q=q)
    with connection.cursor() as cursor:
        cursor.execute(sql, q.values)
        columns = [c.name for c in cursor.description]
        rows = [dict(zip(columns, r, strict=True)) for r in cursor.fetchall()]
    classes: dict[str, list[str]] = defaultdict(list)
    buckets: dict[str, int] = defaultdict(int)
    bucket_of: dict[str, str] = {}
    for row in rows:
        name, bucket = _classify(row, len(request.devices))
        classes[name].append(row["id"])
        if bucket is not None:
            buckets[bucket] += 1
            bucket_of[row["id"]] = bucket
    removed: dict[str, Any] = {"notSchedulable": dict(sorted(buckets.items()))}
    for name in ORDER[1:-1]:
        removed[name] = len(classes[name])
    samples = {
        name: _reasons(name, classes[name][:SAMPLES], request=request, window=window, bucket_of=bucket_of)
        for name in ORDER[:-1]
        if classes[name]
    }
    return {"nodes": len(rows), "removed": removed, "fit": len(classes["fit"]), "samples": samples}


def _rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _iso(moment: datetime | None) -> str:
    return "open-ended" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _windows_by_node(node_ids: list[str], *, window: Window) -> dict[str, str]:
    """The maintenance windows holding these nodes during the request's window, phrased per node."""
    phrases: dict[str, list[str]] = defaultdict(list)
    for ref in windows_overlapping(start=window.start, end=window.end, node_ids=node_ids):
        for node_id in ref.node_ids:
            phrases[node_id].append(
                window_phrase(
                    reason=ref.reason, node_ids=(node_id,), starts_at=ref.starts_at, ends_at=ref.ends_at
                )
            )
    return {node_id: "; ".join(texts) for node_id, texts in phrases.items()}


def _reasons(
    name: str,
    node_ids: list[str],
    *,
    request: ReservationRequest,
    window: Window,
    bucket_of: dict[str, str],
) -> list[dict[str, str]]:
    """The precise reason for each sample node of one class, in words."""
    if not node_ids:
        return []
    texts: dict[str, str] = {}
    if name == "notSchedulable":
        for node_id, cordoned, cordon_reason, maintenance, maintenance_reason, connectivity, taints in _rows(
            "SELECT id, cordoned, cordon_reason, maintenance, maintenance_reason, connectivity,"
            " noschedule_taints FROM inventory_node WHERE id = ANY(%(ids)s)",
            {"ids": node_ids},
        ):
            parts = [bucket_of[node_id]]
            if cordoned:
                parts.append(f"cordoned: {cordon_reason}" if cordon_reason else "cordoned")
            if maintenance:
                parts.append(
                    f"in maintenance: {maintenance_reason}" if maintenance_reason else "in maintenance"
                )
            if connectivity != "connected":
                parts.append(f"connectivity {connectivity}")
            if taints:
                parts.append(f"{taints} NoSchedule taint(s)")
            texts[node_id] = "; ".join(parts)
    elif name == "scalars":
        asked = {r: a for r, a in request.resources.items() if a and a > 0}
        for node_id, resource, capacity, allocated in _rows(
            "SELECT node_id, resource, floor(allocatable * ratio)::bigint, allocated"
            " FROM inventory_noderesource WHERE node_id = ANY(%(ids)s) AND resource = ANY(%(resources)s)"
            " ORDER BY node_id, resource",
            {"ids": node_ids, "resources": sorted(asked)},
        ):
            if capacity - allocated < asked[resource] and node_id not in texts:
                texts[node_id] = f"{resource} {allocated} of {capacity} claimed, {asked[resource]} asked"
        for node_id in node_ids:
            texts.setdefault(node_id, f"no {', '.join(sorted(asked))} on the node")
    else:
        item = request.devices[0]
        q = Params()
        window_expr = window_sql(window, q)
        matching = f"d.device_class = {q.p(item.device_class)} AND {selector_sql(item.selector, q)}"
        # Per sample node, the matching atoms and, for each busy one, when its blocking booking ends.
        overlapping = (
            "FROM device_bookings b WHERE b.device_id = d.id"
            f" AND COALESCE(upper(b.during), 'infinity'::timestamptz) > lower({window_expr})"
            f" AND lower(b.during) < upper({window_expr})"
        )
        sql = (
            "SELECT d.node_id, d.uid, d.attributes ->> 'nvlinkDomain',"
            f" EXISTS (SELECT 1 {overlapping}), EXISTS (SELECT 1 {overlapping} AND upper_inf(b.during)),"
            f" (SELECT max(upper(b.during)) {overlapping})"
            f" FROM inventory_device d WHERE d.node_id = ANY({q.p(node_ids, 'text[]')})"
            f" AND d.bookable AND d.healthy AND {matching} ORDER BY d.node_id, d.uid"
        )
        atoms: dict[str, list[tuple[str, str | None, bool, datetime | None]]] = defaultdict(list)
        for node_id, uid, domain, busy, open_ended, until in _rows(sql, q.values):
            atoms[node_id].append((uid, domain, busy, None if open_ended else until))
        wanted = f"{item.count} {item.device_class}"
        held = _windows_by_node(node_ids, window=window)
        for node_id in node_ids:
            found = atoms.get(node_id, [])
            free = [uid for uid, _, busy, _ in found if not busy]
            blocked = [(until, uid) for uid, _, busy, until in found if busy]
            if name == "selector":
                texts[node_id] = f"{len(found)} {item.device_class} atoms match the selector, {wanted} asked"
            elif name == "noFreeAtoms":
                # The atom that frees up first (an open-ended hold, never).
                blocked.sort(key=lambda t: (t[0] is None, t[0] or datetime.min, t[1]))
                soonest = f"; {blocked[0][1]} booked until {_iso(blocked[0][0])}" if blocked else ""
                texts[node_id] = f"{len(free)} of {len(found)} free for the window, {wanted} asked{soonest}"
                if node_id in held:
                    texts[node_id] += f"; held by {held[node_id]}"
            elif name == "topology" and request.gang_size:
                texts[node_id] = f"no {gang_key(request)!r} label for the gang"
            else:
                domains: dict[str | None, int] = defaultdict(int)
                for _, domain, busy, _ in found:
                    if not busy and domain is not None:
                        domains[domain] += 1
                best = max(domains.values(), default=0)
                texts[node_id] = f"the largest NVLink domain has {best} free, {wanted} asked"
    return [{"nodeId": node_id, "reason": texts.get(node_id, name)} for node_id in node_ids]
