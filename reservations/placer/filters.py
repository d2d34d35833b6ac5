"""The placer's filters: which nodes and atoms can take a request, as set-based SQL.

Everything here builds SQL fragments over three aliases: `n` (inventory_node),
`p` (inventory_pool) and `d` (inventory_device). Values are always bound
parameters; only the shape of the query (which filters apply) is Python.

A node passes when:

* its pool is the request's pool and is not archived;
* it is schedulable (`inventory.schedulability.schedulable_sql`, the one definition);
* each scalar claim fits `floor(allocatable * ratio) - allocated` on it;
* for every device item, it holds enough healthy, bookable atoms of the
  item's class that match the item's selector and are free for the whole
  window (no overlapping booking: the `NOT EXISTS` probe is served by the
  exclusion constraint's GiST index on `(device_id, during)`);
* with `nvlink-all`, that many of them share one `nvlinkDomain`;
* with `binding: node`, every bookable atom of the node is healthy and free;
* in a gang, it carries the gang's topology label.

In "displace" mode (a regular request that only fits by taking spot
bookings), a booking that belongs to a live spot reservation does not make an
atom busy; such atoms are flagged `displaced` so they are chosen last.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inventory.attributes import NODE_LABEL_PREFIX, attribute_type
from inventory.choices import CLASS_SHARING, GPU_ATOM_CLASSES
from inventory.schedulability import schedulable_sql
from reservations.placer.sql import Params
from reservations.request.types import DeviceRequest, ReservationRequest, Selector

_COMPARE = {"eq": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


@dataclass(frozen=True)
class Window:
    """The booking window `[start, end)` and the `compute_now()` it was computed at."""

    start: datetime
    end: datetime
    now: datetime


@dataclass(frozen=True)
class PlanQuery:
    """What one plan's queries rank: a request in its window, spot bookings free or not, nodes left out."""

    request: ReservationRequest
    window: Window
    # Displace mode: a live spot reservation's booking does not make an atom busy.
    displace: bool = False
    exclude_node_ids: tuple[str, ...] = ()


def sharing_mismatch(*, request: ReservationRequest, pool_sharing: str) -> str | None:
    """Why the request's classes or sharing modes cannot be served by this pool, or None.

    `gpu.mig` atoms exist only in a `mig` pool, `gpu.slot` only in a
    `timeslice`/`mps` pool and whole `gpu` atoms only in an `exclusive` pool;
    an explicit `sharing` on an item must agree with both.
    """
    for index, item in enumerate(request.devices):
        modes = CLASS_SHARING[item.device_class]
        if item.device_class not in GPU_ATOM_CLASSES:
            # NIC VFs, disks and whole nodes exist in every pool and are never shared.
            if item.sharing not in (None, *modes):
                return f"devices[{index}]: {item.device_class} atoms are not shared"
            continue
        if item.sharing is not None and item.sharing not in modes:
            return f"devices[{index}]: class {item.device_class} is not {item.sharing}"
        if pool_sharing not in modes:
            needs = "/".join(modes)
            return f"devices[{index}]: class {item.device_class} needs a {needs} pool, not {pool_sharing}"
    return None


def _json_value(column: str, key: str, kind: type) -> str:
    if kind is int:
        # Numbers compare as numbers; a non-number under that name never matches.
        return (
            f"(CASE WHEN jsonb_typeof({column} -> {key}) = 'number' THEN ({column} ->> {key})::numeric END)"
        )
    return f"({column} ->> {key})"


def selector_sql(selector: Selector, q: Params, *, d: str = "d", n: str = "n") -> str:
    """The normalized selector as one SQL predicate over device `d` and node `n`.

    Attributes come from `d.attributes`, typed by the registry (ints compare
    as numbers); `node.<label>` reads `n.labels` as text. `ne` and `notIn`
    match a device that lacks the attribute, as label selectors usually do.
    """
    clauses: list[str] = []
    for name, ops in sorted(selector.items()):
        kind: type
        if name.startswith(NODE_LABEL_PREFIX):
            column, key_name, kind = f"{n}.labels", name[len(NODE_LABEL_PREFIX) :], str
        else:
            column, key_name, kind = f"{d}.attributes", name, attribute_type(name) or str
        key = q.p(key_name)
        value_expr = _json_value(column, key, kind)
        cast = "numeric" if kind is int else "text"
        for op, value in sorted(ops.items()):
            if op == "exists":
                clause = f"({column} ? {key})"
                clauses.append(clause if value else f"NOT {clause}")
            elif op in _COMPARE:
                clauses.append(f"{value_expr} {_COMPARE[op]} {q.p(value, cast)}")
            elif op == "ne":
                clauses.append(f"{value_expr} IS DISTINCT FROM {q.p(value, cast)}")
            elif op == "in":
                clauses.append(f"COALESCE({value_expr} = ANY({q.p(list(value), cast + '[]')}), false)")
            elif op == "notIn":
                clauses.append(f"NOT COALESCE({value_expr} = ANY({q.p(list(value), cast + '[]')}), false)")
            else:  # the request validator refuses other operators; never match on one
                clauses.append("false")
    return " AND ".join(clauses) if clauses else "true"


def window_sql(window: Window, q: Params) -> str:
    return f"tstzrange({q.p(window.start)}, {q.p(window.end)}, '[)')"


def booking_overlaps_sql(*, booking: str, window_expr: str) -> str:
    """`booking.during && window`, written as the two bound comparisons of `[)` ranges.

    Bookings are always `[start, end)` (or `[start, )` while a layout change is
    open-ended), so they overlap the window exactly when they end after it
    starts and start before it ends. Spelled this way, the probe is served by
    the btree index `booking_device_ends` on `(device_id, COALESCE(upper(during),
    'infinity'))`, which skips the atom's history; the `&&` form is served by
    the exclusion constraint's GiST index, several times slower per atom.
    """
    return (
        f"COALESCE(upper({booking}.during), ('infinity')::timestamp with time zone) > lower({window_expr})"
        f" AND lower({booking}.during) < upper({window_expr})"
    )


def blocking_booking_sql(*, device: str, window_expr: str, displace: bool) -> str:
    """EXISTS a booking of `device` that overlaps the window and cannot be displaced."""
    overlaps = booking_overlaps_sql(booking="b", window_expr=window_expr)
    if not displace:
        return f"EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_id = {device}.id AND {overlaps})"
    # Only allocation bookings of a spot reservation may be displaced; a
    # layout-change booking (guard 2) or a regular reservation always blocks.
    return (
        "EXISTS (SELECT 1 FROM device_bookings b"
        " LEFT JOIN reservations_allocation ba ON ba.id = b.allocation_id"
        " LEFT JOIN reservations_reservation br ON br.id = ba.reservation_id"
        f" WHERE b.device_id = {device}.id AND {overlaps}"
        " AND NOT COALESCE(br.spot, false))"
    )


def spot_booking_sql(*, device: str, window_expr: str) -> str:
    """EXISTS a (displaceable) spot booking of `device` overlapping the window."""
    return (
        "EXISTS (SELECT 1 FROM device_bookings b"
        " JOIN reservations_allocation ba ON ba.id = b.allocation_id"
        " JOIN reservations_reservation br ON br.id = ba.reservation_id"
        f" WHERE b.device_id = {device}.id AND {booking_overlaps_sql(booking='b', window_expr=window_expr)}"
        " AND br.spot)"
    )


# The schedulability predicate over `n` and its pool `p`: the same text for every plan.
_SCHEDULABLE_SQL = schedulable_sql("n", "p.owner_id")


def node_filters_sql(
    *, request: ReservationRequest, q: Params, exclude_node_ids: tuple[str, ...] = ()
) -> list[str]:
    """The node-level terms (over `n` and its pool `p`): the pool, schedulable, scalars fit, not excluded."""
    where = [
        f"n.pool_id = {q.p(request.pool_id)}",
        "p.archived_at IS NULL",
        _SCHEDULABLE_SQL,
    ]
    for resource, amount in sorted(request.resources.items()):
        if amount and amount > 0:
            where.append(
                "EXISTS (SELECT 1 FROM inventory_noderesource nr WHERE nr.node_id = n.id"
                f" AND nr.resource = {q.p(resource)}"
                f" AND floor(nr.allocatable * nr.ratio) - nr.allocated >= {q.p(amount, 'bigint')})"
            )
    if exclude_node_ids:
        where.append(_excluded_sql(exclude_node_ids, q))
    if request.gang_size:
        where.append(f"n.labels ? {q.p(gang_key(request))}")
    return where


def _excluded_sql(node_ids: tuple[str, ...], q: Params) -> str:
    return f"n.id <> ALL({q.p(list(node_ids), 'text[]')})"


def candidates_sql(query: PlanQuery, *, q: Params, salt: int, salt_expr: str, nodes: int, groups: int) -> str:
    """The CTE `candidates`: the nodes a plan starting now looks at, chosen from the kept counts alone.

    `node_atom_counts` says how many healthy atoms of the first item's class
    each node has free now (`free`), with no booking probed. A plain request
    reads the index `(pool, class, free, spread)` from `(count, pivot)`, the
    pivot drawn from the plan's salt: the fullest nodes that still hold the
    count (bin packing, the strongest scorer) starting at a random node of
    them, and from the start of the index when that runs out, `nodes` in all,
    so a plan reads a bounded slice whatever the pool's size and concurrent
    plans start at different nodes. A gang takes, for the `groups`
    label values whose best `gang.size` nodes are fullest, those nodes and two
    spares each (a pass over the pool's count rows, no booking probed). The
    plan then checks the window, the selector and the scorers on these only.
    """
    request = query.request
    item = request.devices[0]
    pool, device_class, count = q.p(request.pool_id), q.p(item.device_class), q.p(item.count, "int")
    nodes_where = " AND ".join(node_filters_sql(request=request, q=q))
    if not request.gang_size:
        # A 32-bit pivot from the salt (`spread` is hashtext(node_id), an int4).
        # (Never -2**31: a negative literal is read as minus a positive one, out of range.)
        pivot = q.p(salt % (2**32 - 1) - (2**31 - 1), "int")
        limit = q.p(nodes, "int")
        # Each slice is read from the index alone, a few times what is needed in
        # case some of its nodes are not eligible, then checked node by node; the
        # second slice (the start of the index) is read only when the first ends early.
        fetched = q.p(3 * nodes, "int")

        def slice_sql(start: str) -> str:
            return (
                "(SELECT c.node_id, c.free, c.spread FROM (SELECT node_id, free, spread FROM node_atom_counts"
                f" WHERE pool_id = {pool} AND device_class = {device_class} AND {start}"
                f" ORDER BY free, spread LIMIT {fetched}) c"
                " JOIN inventory_node n ON n.id = c.node_id JOIN inventory_pool p ON p.id = n.pool_id"
                f" WHERE {nodes_where} ORDER BY c.free, c.spread LIMIT {limit})"
            )

        return (
            "candidates AS (SELECT node_id FROM ("
            f"{slice_sql(f'(free, spread) >= ({count}, {pivot})')} UNION ALL {slice_sql(f'free >= {count}')}"
            f") x LIMIT {limit})"
        )
    label = q.p(gang_key(request))
    counted = (
        f"SELECT c.node_id, c.free, n.labels ->> {label} AS gv FROM node_atom_counts c"
        " JOIN inventory_node n ON n.id = c.node_id JOIN inventory_pool p ON p.id = n.pool_id"
        f" WHERE c.pool_id = {pool} AND c.device_class = {device_class} AND c.free >= {count}"
        f" AND {nodes_where}"
    )
    size = q.p(request.gang_size, "int")
    node_order = f"free, hashtextextended(node_id, {salt_expr}), node_id"
    return (
        f"counted AS ({counted}),\n"
        f"ranked_counts AS (SELECT *, row_number() OVER (PARTITION BY gv ORDER BY {node_order}) AS rn"
        " FROM counted),\n"
        f"groups AS (SELECT gv FROM ranked_counts WHERE rn <= {size} GROUP BY gv HAVING count(*) >= {size}"
        f" ORDER BY sum(free), hashtextextended(gv, {salt_expr}), gv LIMIT {q.p(groups, 'int')}),\n"
        "candidates AS (SELECT r.node_id FROM ranked_counts r JOIN groups g ON g.gv = r.gv"
        f" WHERE r.rn <= {size} + 2)"
    )


def eligible_nodes_sql(
    query: PlanQuery,
    *,
    window_expr: str,
    q: Params,
    only_node_ids: tuple[str, ...] = (),
    from_candidates: bool = False,
) -> str:
    """SELECT of the pool's nodes that are schedulable, fit the scalars, and (whole-node) are wholly free.

    `only_node_ids` narrows the scan to a shortlist (the atoms query of a plan);
    `from_candidates` to the CTE `candidates` (`candidates_sql`).
    """
    request = query.request
    if from_candidates:
        # `candidates_sql` applied the node terms in the same statement (one snapshot):
        # they are not read again, which also keeps the plan's text within the 4 kB
        # that psycopg parses once and keeps (longer texts are parsed on every call).
        where = ["n.id IN (SELECT node_id FROM candidates)"]
        if query.exclude_node_ids:
            where.append(_excluded_sql(query.exclude_node_ids, q))
    else:
        where = node_filters_sql(request=request, q=q, exclude_node_ids=query.exclude_node_ids)
    if only_node_ids:
        where.append(f"n.id = ANY({q.p(list(only_node_ids), 'text[]')})")
    if request.binding == "node":
        busy = blocking_booking_sql(device="wd", window_expr=window_expr, displace=query.displace)
        where.append(
            "NOT EXISTS (SELECT 1 FROM inventory_device wd WHERE wd.node_id = n.id AND wd.bookable"
            f" AND (NOT wd.healthy OR {busy}))"
        )
    pool = "" if from_candidates else " JOIN inventory_pool p ON p.id = n.pool_id"
    return f"SELECT n.id, n.labels FROM inventory_node n{pool} WHERE {' AND '.join(where)}"


def gang_key(request: ReservationRequest) -> str:
    return request.gang_topology_key or "fabric"


def item_atoms_sql(*, item: DeviceRequest, window_expr: str, q: Params, displace: bool) -> str:
    """SELECT of the item's free atoms on eligible nodes (CTE `eligible` aliased `n`).

    Ranking only aggregates it per (node, NUMA node, NVLink domain) in `grp_<i>`,
    so the planner inlines it there and never materializes one row per atom.
    """
    return (
        "SELECT d.node_id, d.id AS device_id, d.uid, d.device_class,"
        " CASE WHEN jsonb_typeof(d.attributes -> 'numaNode') = 'number'"
        " THEN (d.attributes ->> 'numaNode')::int END AS numa,"
        " d.attributes ->> 'nvlinkDomain' AS nvl,"
        f" {spot_booking_sql(device='d', window_expr=window_expr) if displace else 'false'} AS displaced"
        " FROM inventory_device d JOIN eligible n ON n.id = d.node_id"
        f" WHERE d.bookable AND d.healthy AND d.device_class = {q.p(item.device_class)}"
        f" AND {selector_sql(item.selector, q)}"
        f" AND NOT {blocking_booking_sql(device='d', window_expr=window_expr, displace=displace)}"
    )


def item_topology(request: ReservationRequest, item: DeviceRequest) -> str:
    """An item is `nvlink-all` when it says so, or when the request does and the item is whole GPUs."""
    if item.topology == "nvlink-all":
        return "nvlink-all"
    if request.topology == "nvlink-all" and item.device_class == "gpu":
        return "nvlink-all"
    return "any"


def item_fit_sql(*, index: int, item: DeviceRequest, request: ReservationRequest, q: Params) -> str:
    """Per node: free atoms of the item, displaced ones needed, and whether the count fits."""
    count = q.p(item.count, "int")
    if item_topology(request, item) == "nvlink-all":
        # The largest group of free atoms sharing one NVLink domain must hold the whole count.
        return (
            f"SELECT node_id, sum(c) AS free, sum(nd) AS not_displaced FROM ("
            f"SELECT node_id, nvl, sum(c) AS c, sum(nd) AS nd"
            f" FROM grp_{index} WHERE nvl IS NOT NULL GROUP BY node_id, nvl) g"
            f" GROUP BY node_id HAVING max(c) >= {count}"
        )
    return (
        f"SELECT node_id, sum(c) AS free, sum(nd) AS not_displaced"
        f" FROM grp_{index} GROUP BY node_id HAVING sum(c) >= {count}"
    )


def item_groups_sql(*, index: int) -> str:
    """The item's free atoms counted per (node, NUMA node, NVLink domain): all that ranking needs."""
    return (
        f"SELECT node_id, numa, nvl, count(*) AS c, count(*) FILTER (WHERE NOT displaced) AS nd"
        f" FROM atoms_{index} GROUP BY node_id, numa, nvl"
    )


def numa_best_sql(*, index: int) -> str:
    """Per node: the most free atoms of item `index` on one NUMA node (for the locality scorer)."""
    return (
        f"SELECT node_id, max(c) AS numa_best FROM (SELECT node_id, numa, sum(c) AS c"
        f" FROM grp_{index} WHERE numa IS NOT NULL GROUP BY node_id, numa) g GROUP BY node_id"
    )


def with_clause(
    query: PlanQuery, *, q: Params, only_node_ids: tuple[str, ...] = (), candidates: str = ""
) -> tuple[str, str]:
    """The common table expressions of one plan, and the window expression they use.

    `candidates` (from `candidates_sql`) narrows the plan to the nodes it names.
    """
    request, displace = query.request, query.displace
    window_expr = window_sql(query.window, q)
    eligible = eligible_nodes_sql(
        query, window_expr=window_expr, q=q, only_node_ids=only_node_ids, from_candidates=bool(candidates)
    )
    ctes = [*([candidates] if candidates else []), f"eligible AS ({eligible})"]
    for index, item in enumerate(request.devices):
        ctes.append(
            f"atoms_{index} AS ({item_atoms_sql(item=item, window_expr=window_expr, q=q, displace=displace)})"
        )
        ctes.append(f"grp_{index} AS ({item_groups_sql(index=index)})")
        ctes.append(f"fit_{index} AS ({item_fit_sql(index=index, item=item, request=request, q=q)})")
    ctes.append(f"numa AS ({numa_best_sql(index=0)})")
    return "WITH " + ",\n".join(ctes), window_expr


def features_sql(*, request: ReservationRequest, q: Params) -> str:
    """Per fitting node, the numbers the scorers read: free, wanted, NUMA best, soft taints, displaced."""
    joins = " ".join(f"JOIN fit_{i} f{i} ON f{i}.node_id = e.id" for i in range(len(request.devices)))
    free = " + ".join(f"f{i}.free" for i in range(len(request.devices)))
    wanted_total = sum(item.count for item in request.devices)
    needs = " + ".join(
        f"GREATEST(0, {q.p(item.count, 'int')} - f{i}.not_displaced)"
        for i, item in enumerate(request.devices)
    )
    return (
        "SELECT e.id AS node_id, e.labels,"
        f" ({free}) AS free, {q.p(wanted_total, 'int')} AS wanted,"
        f" {q.p(request.devices[0].count, 'int')} AS primary_wanted,"
        " COALESCE(nu.numa_best, 0) AS numa_best,"
        " (SELECT count(*) FROM inventory_taint t WHERE t.node_id = e.id AND t.effect = 'PreferNoSchedule')"
        " AS soft_taints,"
        f" ({needs}) AS displaced"
        f" FROM eligible e {joins} LEFT JOIN numa nu ON nu.node_id = e.id"
    )


def atoms_of_nodes_sql(*, request: ReservationRequest, node_ids_expr: str, one: bool = False) -> str:
    """The free atoms of every item on the shortlisted nodes, for choosing atoms in Python.

    `one`: `node_ids_expr` is one node's id, compared with `=`. A subquery run per
    shortlisted node built a one-element array and searched it for each of the
    candidates' atoms (0.7 M of the placement's 8 M instructions in PostgreSQL).
    """
    where = f"node_id = {node_ids_expr}" if one else f"node_id = ANY({node_ids_expr})"
    parts = [
        f"SELECT {i} AS item, node_id, device_id, uid, device_class, numa, nvl, displaced"
        f" FROM atoms_{i} WHERE {where}"
        for i in range(len(request.devices))
    ]
    return " UNION ALL ".join(parts)


def whole_node_atoms_sql(*, node_ids_expr: str) -> str:
    """Every bookable atom of the chosen nodes (binding `node`), already known free and healthy."""
    return (
        "SELECT -1 AS item, d.node_id, d.id AS device_id, d.uid, d.device_class,"
        " NULL::int AS numa, NULL::text AS nvl, false AS displaced"
        f" FROM inventory_device d WHERE d.node_id = ANY({node_ids_expr}) AND d.bookable"
    )


def row_dicts(cursor: Any) -> list[dict[str, Any]]:
    columns = [col.name for col in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
