"""The families read from the database when Prometheus scrapes.

A handful of indexed or grouped reads, formatted straight into text
(`operations.metrics.text`): the rollups (one row per pool and resource),
nodes grouped by pool, state, connectivity and bucket, the at-risk
reservations through their partial index, the worker's rows, the outbox, the
live wait slots. None grows with the bookings.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection

from core.worker_status import worker_status
from inventory.schedulability import bucket_sql
from operations.metrics.events import event_counts
from operations.metrics.text import Family
from reservations.models import ROLLUP_COUNTS

# The rollup's columns, in the order of the query below: each is a `column` label value.
CAPACITY_COLUMNS = ROLLUP_COUNTS
POOL_LABELS = ("pool_id", "pool", "owner", "gpu_model")

_CAPACITY_SQL = f"""
SELECT p.id, p.name, p.owner_id, p.gpu_model, r.resource, {", ".join(f"r.{c}" for c in CAPACITY_COLUMNS)}
  FROM pool_capacity_rollup r JOIN inventory_pool p ON p.id = r.pool_id
 WHERE p.archived_at IS NULL
 ORDER BY p.id, r.resource
"""

# Grouped on the node's plain columns first, so the bucket's CASE runs once per group, not per
# node, and the pool (its owner, whether archived) is joined to those few groups, not to every
# node: at 10,000 nodes the join before the grouping was a third of the statement's time.
_NODES_SQL = f"""
SELECT g.pool_id, g.provision_state, g.connectivity, {bucket_sql("g", "p.owner_id")}, sum(g.n)::int
  FROM (SELECT n.pool_id, n.provision_state, n.connectivity, n.role, n.trust, n.owner_id,
               n.maintenance, n.cordoned, n.noschedule_taints, n.converged_specs, count(*) AS n
          FROM inventory_node n
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) g
  JOIN inventory_pool p ON p.id = g.pool_id
 WHERE p.archived_at IS NULL
 GROUP BY 1, 2, 3, 4
 ORDER BY 1, 2, 3, 4
"""

# Every live pool with its name and its at-risk count (the reservations read through their
# partial index, grouped before the join): the pools' names for the other families too.
_POOLS_AT_RISK_SQL = """
SELECT p.id, p.name, coalesce(a.n, 0)
  FROM inventory_pool p
  LEFT JOIN (SELECT r.pool_id, count(*)::int AS n
               FROM reservations_reservation r
              WHERE r.at_risk_since IS NOT NULL AND r.state IN ('scheduled', 'active')
                AND r.ends_at > compute_now()
              GROUP BY 1) a ON a.pool_id = p.id
 WHERE p.archived_at IS NULL
 ORDER BY p.id
"""

# The outbox and the creates waiting now, in one row.
_QUEUES_SQL = """
SELECT (SELECT count(*)::int FROM reservations_delivery),
       (SELECT extract(epoch FROM compute_now() - min(created_at))::float8 FROM reservations_delivery),
       (SELECT count(*)::int FROM reservations_waitslot WHERE expires_at > compute_now())
"""


def _capacity() -> Iterator[Family]:
    capacity = Family(
        "better_compute_pool_capacity",
        "gauge",
        "A pool's capacity rollup per resource (GPUs, or the resource's own unit) and column; "
        "summing over `column` means nothing (total = allocatable + the four buckets).",
        (*POOL_LABELS, "resource", "column"),
    )
    with connection.cursor() as cursor:
        cursor.execute(_CAPACITY_SQL)
        for row in cursor.fetchall():
            pool_id, name, owner, model, resource = row[:5]
            labels = (pool_id, name, owner, model or "other", resource)
            capacity.add_each(labels, zip(CAPACITY_COLUMNS, row[5:], strict=True))
    yield capacity


def _at_risk() -> tuple[Family, dict[str, str]]:
    """The at-risk family, and the live pools' names (pool id -> name) read with it."""
    family = Family(
        "better_compute_pool_at_risk_reservations",
        "gauge",
        "Live reservations of the pool marked at risk (their booking could not be kept or moved).",
        ("pool_id", "pool"),
    )
    with connection.cursor() as cursor:
        cursor.execute(_POOLS_AT_RISK_SQL)
        rows = cursor.fetchall()
    # Every pool has a series, at 0 when none is at risk, so an alert on `> 0` sees it appear.
    for pool_id, name, count in rows:
        family.add((pool_id, name), count)
    return family, {pool_id: name for pool_id, name, _count in rows}


def _nodes(pool_names: dict[str, str]) -> Family:
    family = Family(
        "better_compute_nodes",
        "gauge",
        "Nodes per pool by provision state, connectivity and capacity bucket.",
        ("pool_id", "pool", "provision_state", "connectivity", "bucket"),
    )
    with connection.cursor() as cursor:
        cursor.execute(_NODES_SQL)
        for pool_id, state, connectivity, bucket, count in cursor.fetchall():
            family.add((pool_id, pool_names.get(pool_id, ""), state, connectivity, bucket), count)
    return family


def _worker() -> Iterator[Family]:
    status = worker_status()
    behind = Family(
        "better_compute_worker_behind",
        "gauge",
        "1 when the worker is behind (the rule of /healthz's 503), else 0.",
    )
    behind.add((), 0 if status.healthy else 1)
    age = Family(
        "better_compute_worker_last_pass_age_seconds",
        "gauge",
        "Seconds since some worker process last finished a pass (-1: none ever ran).",
    )
    age.add((), round(status.pass_age, 3) if status.pass_age is not None else -1)
    lag = Family(
        "better_compute_worker_job_lag_seconds",
        "gauge",
        "How long a job's work has been left undone: 0 after a success, the time since its last "
        "success while it fails, the time since it started while it runs (-1: never succeeded).",
        ("worker_job",),
    )
    duration = Family(
        "better_compute_worker_job_last_duration_seconds",
        "gauge",
        "How long the job's last finished run took.",
        ("worker_job",),
    )
    failing = Family(
        "better_compute_worker_job_failing",
        "gauge",
        "1 when the job's last run failed.",
        ("worker_job",),
    )
    for job in status.jobs:
        lag.add((job.name,), round(job.lag, 3) if job.lag is not None else -1)
        duration.add((job.name,), round(job.seconds, 6))
        failing.add((job.name,), 1 if job.error else 0)
    yield from (behind, age, lag, duration, failing)


def _queues() -> Iterator[Family]:
    with connection.cursor() as cursor:
        cursor.execute(_QUEUES_SQL)
        rows, oldest, waiting = cursor.fetchone()
    outbox = Family(
        "better_compute_outbox_rows",
        "gauge",
        "Deliveries to nodes committed and not yet answered by the node.",
    )
    outbox.add((), rows)
    age = Family(
        "better_compute_outbox_oldest_age_seconds",
        "gauge",
        "Age of the oldest undelivered outbox row (0 when the outbox is empty).",
    )
    age.add((), round(max(oldest or 0.0, 0.0), 3))
    waits = Family(
        "better_compute_creates_waiting",
        "gauge",
        "Creates waiting for capacity now (`wait.timeoutMs`), on every server.",
    )
    waits.add((), waiting)
    yield from (outbox, age, waits)


def database_families() -> list[Family]:
    """Every family read from the database, one short read each (none holds a lock)."""
    at_risk, pool_names = _at_risk()
    families = [*_capacity(), at_risk, _nodes(pool_names)]
    families.extend(_worker())
    families.extend(_queues())
    families.append(event_counts())
    return families
