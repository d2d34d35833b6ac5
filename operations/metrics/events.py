"""Counts of audited events: repairs, at-risk marks, disconnects, node refusals, unhealthy devices.

Most of these are made by the worker, which nobody scrapes, so they are
counted from the audit trail, the one record every process writes. Counting
the whole trail per scrape would grow with it: each process keeps the counts
up to a settled id (below which every row is older than `SETTLE_SECONDS`, so
no transaction still open can add one there) and counts only the rows past it.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from django.db import connection

from operations.metrics.text import Family

# event label -> the audit rows it counts (action, and the actor where it narrows).
EVENTS: dict[str, tuple[str, str | None]] = {
    "reservation_moved": ("reservation.repaired", None),
    "reservation_at_risk": ("reservation.at-risk", None),
    "node_disconnected": ("node.disconnected", None),
    # Guard 6: a node refused an assignment, and the release it brings is the node's.
    "node_refusal": ("reservation.release", "node"),
    "device_unhealthy": ("device.reported-unhealthy", None),
}
SETTLE_SECONDS = 300

EVENTS_ACTIONS = sorted({action for action, _actor in EVENTS.values()})

# The rows past the mark, split at the new mark: the newest id among those older than the settle time.
# Both materialized: inlined, the one-row `mark` was planned as the inner side of a nested loop and
# its aggregate computed again for every recent row (8 s for the 6,000 events of a mass repair,
# when the table's statistics did not know them yet).
COUNT_SQL = """
WITH recent AS MATERIALIZED (
    SELECT a.id, a.at, a.action, (a.action = 'reservation.release' AND a.actor = 'node') AS by_node
      FROM core_auditevent a
     WHERE a.id > %(after)s AND a.action = ANY(%(actions)s)
), mark AS MATERIALIZED (
    SELECT coalesce(max(id), %(after)s) AS upto
      FROM recent WHERE at < compute_now() - make_interval(secs => %(settle)s)
)
SELECT r.action, r.by_node, count(*) FILTER (WHERE r.id <= m.upto)::int,
       count(*) FILTER (WHERE r.id > m.upto)::int, m.upto
  FROM recent r CROSS JOIN mark m
 GROUP BY 1, 2, m.upto
"""


class _Settled:
    """The counts of the rows up to `upto`, kept by this process between scrapes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.upto = 0
        self.counts: Counter[str] = Counter()


_settled = _Settled()


def _event(action: str, by_node: bool) -> str | None:
    for event, (wanted, actor) in EVENTS.items():
        if action == wanted and (actor is None or (actor == "node") == by_node):
            return event
    return None


def event_counts() -> Family:
    """The events counter family: the settled counts plus the rows past them, read now."""
    family = Family(
        "better_compute_events_total",
        "counter",
        "Audited events: reservations moved or marked at risk by the repair, nodes disconnected "
        "by liveness, assignments refused by a node (guard 6), devices reported unhealthy.",
        ("event",),
    )
    with _settled.lock:
        params: dict[str, Any] = {"after": _settled.upto, "settle": SETTLE_SECONDS, "actions": EVENTS_ACTIONS}
        with connection.cursor() as cursor:
            cursor.execute(COUNT_SQL, params)
            rows = cursor.fetchall()
        recent: Counter[str] = Counter()
        for action, by_node, settled, fresh, upto in rows:
            event = _event(action, bool(by_node))
            if event is not None:
                _settled.counts[event] += settled
                recent[event] += fresh
            _settled.upto = max(_settled.upto, upto)
        for event in EVENTS:
            family.add((event,), _settled.counts[event] + recent[event])
    return family


def forget() -> None:
    """Drop this process's settled counts (a test's database starts over; production never calls it)."""
    with _settled.lock:
        _settled.upto = 0
        _settled.counts.clear()
