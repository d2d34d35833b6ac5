"""The worker's records: one `WorkerJob` row per job, written as it runs, read by `/healthz` and the admin.

Every time is the database clock (`compute_now()`), like everything else the
service stamps. Besides one row per job, the worker keeps a row named `worker`
(`HEARTBEAT_ROW`) for its passes: the last time a worker process was seen
alive, written after each pass that ran jobs and at least once per sleep when
idle. Several workers share the rows (the newest write wins), so the rows say
whether *some* worker keeps the ledger true, which is the question `/healthz`
answers.

When is the worker behind (the 503 of `/healthz`)?

* no `worker` row at all: no worker has ever run against this database;
* the `worker` row is older than `CAPACITY_WORKER_MAX_SLEEP_SECONDS` +
  `CAPACITY_WORKER_LAG_SECONDS`: a live worker wakes at least once per max
  sleep, so none is running (or one is stuck);
* a job is behind: its last run failed and its last success is older than
  `CAPACITY_WORKER_LAG_SECONDS` (or it never succeeded), or it has been running
  for longer than the max sleep plus the lag (a sweep of a large fleet may run
  for tens of seconds; one that runs longer is stuck or too slow).

A job's *lag* is how long its work has been left undone: 0 after a successful
run, the time since its last success while it fails, the time since it
started while it runs.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

# The row of the worker itself (its last pass), beside one row per job.
HEARTBEAT_ROW = "worker"

_STARTED_SQL = """
INSERT INTO core_workerjob AS w (name, last_started_at, last_seconds, last_error, last_count, runs, holder)
VALUES (%(name)s, compute_now(), 0, '', 0, 0, %(holder)s)
ON CONFLICT (name) DO UPDATE SET last_started_at = EXCLUDED.last_started_at, holder = EXCLUDED.holder
"""

_FINISHED_SQL = """
INSERT INTO core_workerjob AS w (name, last_started_at, last_finished_at, last_ok_at, last_seconds,
                                 last_error, last_count, runs, holder)
VALUES (%(name)s, compute_now() - make_interval(secs => %(seconds)s), compute_now(),
        CASE WHEN %(ok)s THEN compute_now() END, %(seconds)s, %(error)s, %(count)s, 1, %(holder)s)
ON CONFLICT (name) DO UPDATE
   SET last_finished_at = EXCLUDED.last_finished_at,
       last_ok_at = COALESCE(EXCLUDED.last_ok_at, w.last_ok_at),
       last_seconds = EXCLUDED.last_seconds,
       last_error = EXCLUDED.last_error,
       last_count = EXCLUDED.last_count,
       runs = w.runs + 1,
       holder = EXCLUDED.holder
"""

_STATUS_SQL = """
SELECT compute_now(), w.name, w.last_started_at, w.last_finished_at, w.last_ok_at, w.last_seconds,
       w.last_error, w.last_count, w.runs, w.holder
  FROM (SELECT 1) AS one
  LEFT JOIN core_workerjob w ON true
 ORDER BY w.name
"""


def worker_holder() -> str:
    """`host:pid`, what a job's row says about which worker process ran it last."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_job_started(*, name: str, holder: str) -> None:
    """Stamp a job's start, so a job that runs long (or hangs) shows as running."""
    with connection.cursor() as cursor:
        cursor.execute(_STARTED_SQL, {"name": name, "holder": holder})


def worker_job_finished(*, name: str, holder: str, seconds: float, count: int, error: str = "") -> None:
    """Record how a run ended: its time and count, and its error (empty when it succeeded)."""
    params: dict[str, str | float | int | bool] = {
        "name": name,
        "holder": holder,
        "seconds": float(seconds),
        "count": int(count),
        "error": error,
        "ok": not error,
    }
    with connection.cursor() as cursor:
        cursor.execute(_FINISHED_SQL, params)


def worker_job_ran_within(*, name: str, seconds: float) -> bool:
    """Whether the job succeeded in the last `seconds` (a periodic job another worker just ran is skipped)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM core_workerjob WHERE name = %s"
            " AND last_ok_at > compute_now() - make_interval(secs => %s))",
            [name, float(seconds)],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class JobStatus:
    """One job as `/healthz` and the admin show it."""

    name: str
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_ok_at: datetime | None
    seconds: float
    count: int
    error: str
    runs: int
    holder: str
    running: bool
    # How long the job's work has been left undone (None: it never succeeded and is not running).
    lag: float | None
    behind: bool


@dataclass(frozen=True)
class WorkerStatus:
    """Whether some worker keeps the ledger true, and each job's last run."""

    now: datetime
    last_pass_at: datetime | None
    pass_age: float | None
    holder: str
    jobs: list[JobStatus]
    healthy: bool
    reason: str


def _seconds(later: datetime, earlier: datetime) -> float:
    return max(0.0, (later - earlier).total_seconds())


def _job_status(now: datetime, row: tuple[Any, ...], lag_limit: float, run_limit: float) -> JobStatus:
    name, started_at, finished_at, last_ok, seconds, error, count, runs, holder = row
    running = started_at is not None and (finished_at is None or started_at > finished_at)
    lag: float | None
    if running:
        lag = _seconds(now, started_at)
    elif error:
        lag = _seconds(now, last_ok) if last_ok is not None else None
    else:
        lag = 0.0
    return JobStatus(
        name=name,
        last_started_at=started_at,
        last_finished_at=finished_at,
        last_ok_at=last_ok,
        seconds=float(seconds),
        count=int(count),
        error=error,
        runs=int(runs),
        holder=holder,
        running=running,
        lag=lag,
        behind=lag is None or lag > (run_limit if running else lag_limit),
    )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def worker_status() -> WorkerStatus:
    """Read the rows in one query and judge them (the rules in this module's docstring)."""
    with connection.cursor() as cursor:
        cursor.execute(_STATUS_SQL)
        rows = cursor.fetchall()
    now: datetime = rows[0][0]
    lag_limit = float(settings.CAPACITY_WORKER_LAG_SECONDS)
    pass_limit = float(settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS) + lag_limit
    pass_row = next((r for r in rows if r[1] == HEARTBEAT_ROW), None)
    jobs = [
        _job_status(now, tuple(r[1:]), lag_limit, pass_limit)
        for r in rows
        if r[1] is not None and r[1] != HEARTBEAT_ROW
    ]
    last_pass_at: datetime | None = pass_row[3] if pass_row is not None else None
    pass_age = _seconds(now, last_pass_at) if last_pass_at is not None else None
    reason = ""
    if last_pass_at is None or pass_age is None:
        reason = "worker has not run yet"
    elif pass_age > pass_limit:
        reason = f"worker: last pass {pass_age:.0f} s ago (more than {pass_limit:.0f} s)"
    else:
        for job in jobs:
            if not job.behind:
                continue
            if job.running:
                reason = f"worker job {job.name}: running for {job.lag:.0f} s"
            elif job.lag is None:
                reason = f"worker job {job.name}: never succeeded: {_first_line(job.error)}"
            else:
                reason = f"worker job {job.name}: failing for {job.lag:.0f} s: {_first_line(job.error)}"
            break
    return WorkerStatus(
        now=now,
        last_pass_at=last_pass_at,
        pass_age=pass_age,
        holder=str(pass_row[9] or "") if pass_row is not None else "",
        jobs=jobs,
        healthy=not reason,
        reason=reason,
    )
