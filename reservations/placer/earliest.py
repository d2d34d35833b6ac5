"""Earliest fit: the first start in `[from, from + horizon]` at which a request fits for its whole duration.

The placer answers "does it fit in this window"; asking it at every second of
a week is out of the question, and a fixed grid would miss the answer by up
to a step. The answer can only be `from` itself or an instant at which a
booking ends: between two such instants nothing that blocks the request goes
away (scalars, health, schedulability and labels do not change with the
clock), and a later start only adds time at the window's end. So:

1. the placer is asked at `from`;
2. one statement (`_CANDIDATES`) works out, from the bookings of the atoms
   the request could use, every node's free gaps: for each device item the
   number of its matching atoms booked at each instant, hence the stretches
   where too few are free ("bad"); their union per node; and the gaps between
   them long enough for the duration. A start is then possible on a node
   exactly when it lies in one of the node's gaps (a plain request) or in the
   gaps of `gang.size` nodes sharing one topology label (a gang). The
   statement answers the earliest such instants after the last one tried, in
   order;
3. the placer is asked at each of them, earliest first, and the first that
   fits is the answer, with the option the placer ranks best there.

The counts are a necessary condition, not a sufficient one: enough atoms
free at every instant of a window is not enough atoms free for all of it
(one atom may free up as another is taken), and NVLink domains or two items
of one class ask more. So besides each gap's first instant, the statement
names every booking end inside a gap, and the placer decides. Either way the
answer is exact: nothing earlier fits, and the placer itself said this one
does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection

from inventory.models import Pool
from reservations.placer.filters import Window, gang_key, node_filters_sql, selector_sql
from reservations.placer.plan import Plan, Reason, placement_plan
from reservations.placer.sql import Params
from reservations.request.types import ReservationRequest

# How many instants one statement names; the placer is asked at each in turn.
CANDIDATES_PER_QUERY = 16
# At most this many instants are tried; a search that runs out answers how far it got.
MAX_TRIED = 100
# Reasons that no later start can change: answered at once, without a search.
_TIMELESS = frozenset({"POOL_ARCHIVED", "SHARING_MISMATCH"})


@dataclass
class Earliest:
    """The earliest start found (with the placer's plan there), or why there is none in the horizon."""

    searched_from: datetime
    searched_to: datetime
    plan: Plan | None = None
    reason: Reason | None = None
    # Instants the placer was asked at (the first is `searched_from`).
    tried: int = 0

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits


def _ceil_ms(at: datetime) -> datetime:
    """`at` rounded up to a whole millisecond (a booking may end at any microsecond)."""
    extra = at.microsecond % 1000
    return at if not extra else at + timedelta(microseconds=1000 - extra)


def _items_sql(*, request: ReservationRequest, q: Params) -> list[tuple[str, str]]:
    """Per device item: (the atoms it may use, how many it needs), over the CTE `nodes` aliased `n`."""
    if request.binding == "node":
        # A whole-node lease books every bookable atom: the node is usable only
        # while none is booked (and every one is healthy).
        atoms = (
            "SELECT d.id, d.node_id FROM inventory_device d JOIN nodes n ON n.id = d.node_id"
            " WHERE d.bookable AND NOT EXISTS (SELECT 1 FROM inventory_device u"
            " WHERE u.node_id = n.id AND u.bookable AND NOT u.healthy)"
        )
        return [(atoms, "atoms")]
    items = []
    for item in request.devices:
        atoms = (
            "SELECT d.id, d.node_id FROM inventory_device d JOIN nodes n ON n.id = d.node_id"
            f" WHERE d.bookable AND d.healthy AND d.device_class = {q.p(item.device_class)}"
            f" AND {selector_sql(item.selector, q)}"
        )
        items.append((atoms, q.p(item.count, "int")))
    return items


def _candidates_sql(
    *, request: ReservationRequest, q: Params, after: datetime, first: bool, until: datetime
) -> str:
    """The statement naming the next instants (after `after`; from it when `first`) worth asking at."""
    label = q.p(gang_key(request))
    duration = timedelta(seconds=request.duration_seconds)
    t0, t_end, dur = q.p(after), q.p(until), q.p(duration, "interval")
    # Bookings are read up to the last window that could start in the horizon.
    span_end = f"({t_end} + {dur})"
    ctes = [
        "nodes AS MATERIALIZED (SELECT n.id, n.labels ->> "
        f"{label} AS gv FROM inventory_node n JOIN inventory_pool p ON p.id = n.pool_id"
        f" WHERE {' AND '.join(node_filters_sql(request=request, q=q))})"
    ]
    bad_parts = []
    booked_parts = []
    for index, (atoms_sql, need) in enumerate(_items_sql(request=request, q=q)):
        need_expr = "c.atoms" if need == "atoms" else need
        ctes += [
            f"atoms_{index} AS MATERIALIZED ({atoms_sql})",
            # The nodes with enough matching atoms at all, and how many they have.
            f"cap_{index} AS (SELECT node_id, count(*) AS atoms FROM atoms_{index} GROUP BY node_id"
            + ("" if need == "atoms" else f" HAVING count(*) >= {need}")
            + ")",
            # Their bookings that overlap the span searched, clipped to it.
            f"bk_{index} AS MATERIALIZED (SELECT a.node_id, GREATEST(lower(b.during), {t0}) AS lo,"
            f" LEAST(COALESCE(upper(b.during), 'infinity'::timestamptz), {span_end}) AS hi"
            f" FROM atoms_{index} a JOIN device_bookings b ON b.device_id = a.id"
            f" WHERE COALESCE(upper(b.during), 'infinity'::timestamptz) > {t0}"
            f" AND lower(b.during) < {span_end})",
            # How many of the node's atoms are booked from each instant on.
            f"steps_{index} AS (SELECT node_id, at, sum(sum(delta)) OVER w AS booked,"
            " lead(at) OVER w AS next_at"
            f" FROM (SELECT node_id, lo AS at, 1 AS delta FROM bk_{index}"
            f" UNION ALL SELECT node_id, hi, -1 FROM bk_{index}) e GROUP BY node_id, at"
            " WINDOW w AS (PARTITION BY node_id ORDER BY at))",
        ]
        # Where too few are free: the node cannot take the item then.
        bad_parts.append(
            f"SELECT s.node_id, s.at AS lo, s.next_at AS hi FROM steps_{index} s"
            f" JOIN cap_{index} c ON c.node_id = s.node_id"
            f" WHERE s.next_at IS NOT NULL AND c.atoms - s.booked < {need_expr}"
        )
        booked_parts.append(f"SELECT node_id, hi FROM bk_{index}")
    caps = " ".join(f"JOIN cap_{i} c{i} ON c{i}.node_id = n.id" for i in range(1, len(bad_parts)))
    ctes += [
        # The nodes that have enough matching atoms for every item.
        f"able AS (SELECT n.id, n.gv FROM nodes n JOIN cap_0 c0 ON c0.node_id = n.id {caps})",
        f"bad AS ({' UNION ALL '.join(bad_parts)})",
        # Each bad stretch with the furthest end of the ones before it: a gap
        # lies before it when that end is earlier than its start.
        "ordered AS (SELECT node_id, lo, hi, max(hi) OVER (PARTITION BY node_id ORDER BY lo, hi"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM bad)",
        # The gaps of each able node (the last one open-ended), as the range of
        # starts whose whole window fits in them.
        "last_bad AS (SELECT node_id, max(hi) AS hi FROM bad GROUP BY node_id)",
        f"gaps AS (SELECT node_id, COALESCE(before, {t0}) AS gs, lo - {dur} AS last_start FROM ordered"
        f" WHERE COALESCE(before, {t0}) <= lo - {dur}"
        f" UNION ALL SELECT a.id, COALESCE(l.hi, {t0}), 'infinity'::timestamptz"
        " FROM able a LEFT JOIN last_bad l ON l.node_id = a.id)",
        f"usable AS (SELECT g.node_id, a.gv, g.gs, g.last_start FROM gaps g JOIN able a ON a.id = g.node_id"
        f" WHERE g.gs <= {t_end})",
    ]
    unit = "gv" if request.gang_size else "node_id"
    needed = q.p(request.gang_size or 1, "int")
    # One ordered stream per unit (a node, or a gang's label group): +1 where a
    # node's range of good starts opens, -1 after it closes, and 0 at each
    # booking end inside it: enough atoms free at every instant of a window is
    # not the same as enough atoms free for the whole of it (one atom may free
    # up as another is taken), so the start can be any of those ends.
    events = [
        f"SELECT {unit} AS unit, gs AS at, 0 AS kind, 1 AS delta FROM usable",
        f"SELECT {unit}, last_start, 2, -1 FROM usable WHERE last_start < 'infinity'::timestamptz",
        f"SELECT u.{unit}, k.hi, 1, 0 FROM usable u"
        f" JOIN ({' UNION ALL '.join(booked_parts)}) k ON k.node_id = u.node_id"
        f" AND k.hi > u.gs AND k.hi <= u.last_start AND k.hi <= {t_end}",
    ]
    after_op = ">=" if first else ">"
    return (
        "WITH " + ",\n".join(ctes) + "\n"
        "SELECT DISTINCT at FROM ("
        "SELECT at, kind, sum(delta) OVER (PARTITION BY unit ORDER BY at, kind ROWS UNBOUNDED PRECEDING)"
        f" AS open FROM ({' UNION ALL '.join(events)}) e) s"
        f" WHERE kind < 2 AND open >= {needed} AND at {after_op} {t0} AND at <= {t_end}"
        f" ORDER BY at LIMIT {q.p(CANDIDATES_PER_QUERY, 'int')}"
    )


def candidate_instants(
    *, request: ReservationRequest, after: datetime, until: datetime, first: bool = False
) -> list[datetime]:
    """The next instants, earliest first, at which the counts say the request could start."""
    q = Params()
    sql = _candidates_sql(request=request, q=q, after=after, first=first, until=until)
    with connection.cursor() as cursor:
        cursor.execute(sql, q.values)
        return [row[0] for row in cursor.fetchall()]


def placement_earliest(
    *, request: ReservationRequest, pool: Pool, start: datetime, until: datetime, now: datetime
) -> Earliest:
    """The earliest start in `[start, until]` at which the placer fits the request, or why none does.

    `start` is at or after `now` (the caller clamps it). Spot displacement is
    not considered: the answer is a start at which nothing has to be cut.
    """
    duration = timedelta(seconds=request.duration_seconds)
    answer = Earliest(searched_from=start, searched_to=until)

    def ask(at: datetime) -> Plan:
        answer.tried += 1
        return placement_plan(request=request, pool=pool, window=Window(start=at, end=at + duration, now=now))

    plan = ask(start)
    if plan.fits:
        answer.plan = plan
        return answer
    last_reason = plan.reason
    if last_reason is not None and last_reason.code in _TIMELESS:
        answer.reason = last_reason
        return answer
    after = start
    while True:
        instants = candidate_instants(request=request, after=after, until=until)
        for at in instants:
            if answer.tried >= MAX_TRIED:
                # Exact up to here: nothing before `at` fits.
                answer.searched_to = at
                answer.reason = Reason(
                    "SEARCH_LIMIT",
                    f"no start fits before the {MAX_TRIED} instants tried; search again from searchedTo",
                )
                return answer
            # Asked (and answered) at a whole millisecond, the API's resolution:
            # a create at the answer then starts where the placer was asked.
            plan = ask(_ceil_ms(at))
            if plan.fits:
                answer.plan = plan
                return answer
            last_reason = plan.reason
        if len(instants) < CANDIDATES_PER_QUERY:
            break
        after = instants[-1]
    message = "no start from the beginning to the end of the horizon fits the request for its whole duration"
    if last_reason is not None:
        message += f"; at the beginning: {last_reason.message}" if answer.tried == 1 else ""
    answer.reason = Reason("NO_START_IN_HORIZON", message)
    return answer
