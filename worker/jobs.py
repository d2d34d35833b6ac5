"""The worker: runs the time-driven jobs when they are due, then sleeps until the next deadline or a NOTIFY.

`python manage.py worker` (the Procfile's `worker:`) runs `WorkerLoop.run_forever`.
One pass runs every job that is due, in a fixed order; then the loop asks the
database, in ONE query (`next_deadline`), when the next job falls due, and
sleeps until then (at most `CAPACITY_WORKER_MAX_SLEEP_SECONDS`) or until a
notification arrives on its own LISTEN connection. There is no fixed poll.

What makes a job due:

* a deadline in the rows: the earliest live lease expiry (`lease-expire`), the
  earliest end of a live reservation (`reservation-settle`), the earliest start
  of a future booking or end of a running one (`bookings-advance`), the oldest
  watched heartbeat plus `CAPACITY_NODE_STALE_SECONDS` (`nodes-stale`), the
  earliest outbox retry (`outbox-deliver`), the end of the grace after the
  hour that follows the last closed hour of usage (`usage-close`);
* a period, counted from the job's last success in its `WorkerJob` row (shared
  by every worker): the safety-net rebuild, the rate-window prune and the
  BookingRepair sweep, every `CAPACITY_ROLLUP_EVERY_SECONDS`;
* a notification: `'repair'` on `WORKER_CHANNEL` (a node left the schedulable
  set) makes `bookings-repair` due at once; a `capacity_released` (capacity
  freed up, so at-risk reservations may fit now) makes it due too, but at most
  once per `RELEASE_REPAIR_SECONDS`, so a flood of releases repairs once. Any
  other payload on `WORKER_CHANNEL` is the ISO time of a new deadline (what a
  create or a renew sends): the loop recomputes its plan when that time is
  earlier than the wake-up it planned; an unparsable payload always recomputes.

The database clock is `compute_now()`: the loop converts "deadline minus
compute_now()" into a sleep of the process's monotonic clock, so a deadline is
acted on within the time a pass takes (well inside the 5 s the service
promises), whatever offset the database's clock has. A loop runs its jobs one
after the other, so the worker process runs two loops (`LANES`, one thread and
two connections each): the deadline jobs, whose units of work are short, and
the sweeps (BookingRepair, the rebuild, the prune), which may take a minute at
a large fleet; a sweep never holds a deadline up.

Several workers may run. Each job runs under its own session advisory lock
(`core.locks.ADVISORY_LOCK_KEYS`, `pg_try_advisory_lock`): a worker that finds
a job's lock taken skips it, so two workers never run one job at once. A
periodic job is re-checked under its lock, so a rebuild another worker just
finished is not run again. Every job's unit of work is its own transaction
(and the deadline jobs claim rows `FOR UPDATE SKIP LOCKED`), so a worker
killed mid-pass leaves nothing half-done, and the next pass (of it or of
another worker) finds exactly the work that is left.

A job that raises is logged with its traceback and recorded in its
`WorkerJob` row, and the pass goes on with the other jobs; it is retried after
a backoff (1 s, doubling, at most the max sleep), so a broken job never spins.
A job that succeeds is not rerun for `rerun_after` seconds (1 s), which bounds
the loop when work is left behind by `SKIP LOCKED`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from capacity import usage
from core import ratelimit
from core.constants import WORKER_CHANNEL
from core.locks import ADVISORY_LOCK_KEYS
from core.worker_status import (
    HEARTBEAT_ROW,
    worker_holder,
    worker_job_finished,
    worker_job_ran_within,
    worker_job_started,
)
from reservations import services
from reservations.delivery import outbox
from reservations.lifecycle import phases, repair
from reservations.nodes import liveness
from reservations.rollups import recount as rollups
from reservations.waits import RELEASE_CHANNEL

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]

# The notification that asks for BookingRepair (a node or atom left the schedulable set).
REPAIR_PAYLOAD = "repair"
# How long the loop waits before reconnecting its LISTEN connection, or retrying a failed plan.
RECONNECT_SECONDS = 1.0
# A deadline is slept to a little past it, so `compute_now()` has passed it when the job looks.
DEADLINE_MARGIN_SECONDS = 0.01
# An idle worker writes its `worker` row at most this often (and at least once per max sleep).
HEARTBEAT_SECONDS = 10.0
# Releases wake BookingRepair (at-risk reservations may fit now) at most once per this
# long after its last run ended: a sweep of every at-risk reservation is not cheap.
RELEASE_REPAIR_SECONDS = 30.0
# The loops of one worker process, each with its own connections: the jobs with deadlines
# (short units of work, due within seconds), and the sweeps (BookingRepair, the rebuild,
# the prune), which may run for a minute at a large fleet and must not hold the deadlines up.
LANES = ("deadlines", "sweeps")
# A backlog of usage hours (a first run over a month of bookings) is closed this many hours
# per run, so the sweeps lane turns over; the deadline is then still due and it goes on.
USAGE_HOURS_PER_RUN = 24 * 7


# --- the schedule ----------------------------------------------------------------------------

_DEADLINES_SQL = f"""
SELECT compute_now(),
       (SELECT min(lease_expires_at) FROM reservations_reservation
         WHERE state IN ('scheduled', 'active') AND lease_expires_at IS NOT NULL),
       (SELECT min(ends_at) FROM reservations_reservation WHERE state IN ('scheduled', 'active')),
       (SELECT min(lower(during)) FROM device_bookings WHERE phase = 0),
       (SELECT min(upper(during)) FROM device_bookings WHERE phase = 1),
       (SELECT min(last_heartbeat_at) FROM inventory_node
         WHERE connectivity = 'connected' AND last_heartbeat_at IS NOT NULL)
           + make_interval(secs => %(stale)s),
       (SELECT min(next_attempt_at) FROM reservations_delivery),
       {usage.usage_next_close_sql()},
       ARRAY(SELECT COALESCE(w.last_ok_at + make_interval(secs => p.every), compute_now())
                FROM unnest(%(periodic_names)s::varchar[], %(periodic_every)s::float8[])
                         WITH ORDINALITY AS p(name, every, i)
                LEFT JOIN core_workerjob w ON w.name = p.name
               ORDER BY p.i)
"""

# The deadlines a job can serve (the fields of `Deadlines`).
DEADLINE_KINDS = (
    "lease_expiry",
    "reservation_end",
    "booking_start",
    "booking_end",
    "node_stale",
    "delivery",
    "usage_close",
)


@dataclass(frozen=True)
class Deadlines:
    """When each kind of time-driven work next falls due (None: nothing of that kind is pending)."""

    now: datetime
    lease_expiry: datetime | None
    reservation_end: datetime | None
    booking_start: datetime | None
    booking_end: datetime | None
    node_stale: datetime | None
    delivery: datetime | None
    # A periodic job's next run, by job name: its last success plus its period (now if it never succeeded).
    periodic: dict[str, datetime] = field(default_factory=dict)
    # When the hour after the last closed one may close (None before the first close).
    usage_close: datetime | None = None

    def of(self, kind: str) -> datetime | None:
        value: datetime | None = getattr(self, kind)
        return value

    @property
    def earliest(self) -> datetime | None:
        """The first deadline of any kind (what the loop sleeps until, before caps and backoffs)."""
        times = [t for t in (self.of(kind) for kind in DEADLINE_KINDS) if t is not None]
        times.extend(self.periodic.values())
        return min(times, default=None)


def next_deadline(*, periodic: dict[str, float] | None = None) -> Deadlines:
    """Every kind of deadline in one query, each read from its partial index; `periodic`: job name → period.

    The indexes: `reservation_lease_live`, `reservation_live_ends`,
    `booking_phase_future`, `booking_phase_running`, `node_heartbeat_watch`,
    `delivery_due`, `capacity_usagehour`'s primary key, and `core_workerjob`'s
    primary key for the periodic jobs.
    """
    periodic = periodic if periodic is not None else _periodic_of(worker_jobs())
    names = sorted(periodic)
    with connection.cursor() as cursor:
        cursor.execute(
            _DEADLINES_SQL,
            {
                "stale": float(settings.CAPACITY_NODE_STALE_SECONDS),
                "periodic_names": names,
                "periodic_every": [float(periodic[name]) for name in names],
                "usage_grace": float(settings.CAPACITY_USAGE_CLOSE_GRACE_SECONDS),
            },
        )
        row = cursor.fetchone()
    assert row is not None
    now, lease, ends, start, end, stale, delivery, usage_close, due = row
    return Deadlines(
        now=now,
        lease_expiry=lease,
        reservation_end=ends,
        booking_start=start,
        booking_end=end,
        node_stale=stale,
        delivery=delivery,
        periodic=dict(zip(names, due, strict=True)),
        usage_close=usage_close,
    )


# --- the jobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One of the worker's jobs: what it runs, its lock, and what makes it due."""

    name: str
    run: Callable[[ProgressFn | None], int]
    # The name of its key in `core.locks.ADVISORY_LOCK_KEYS`.
    lock: str
    # The kinds of `Deadlines` it serves.
    deadlines: tuple[str, ...] = ()
    # A period (seconds) counted from its last success, shared by every worker.
    every: float | None = None
    # Due when woken by a 'repair' notification or a release.
    on_wake: bool = False
    # Which of the process's loops runs it (`LANES`): the deadlines never wait behind a sweep.
    lane: str = "deadlines"


@dataclass(frozen=True)
class JobResult:
    name: str
    ok: bool
    count: int
    seconds: float
    error: str = ""


def worker_jobs(*, every: float | None = None) -> list[Job]:
    """The worker's jobs, in the order a pass runs them; the periodic ones every `every` seconds.

    Releases first (leases, ends), then the phases they leave behind, then
    liveness, then BookingRepair (which wants the fresh node states), then the
    deliveries the others enqueued; the periodic chores last. `every` defaults
    to `CAPACITY_ROLLUP_EVERY_SECONDS`. The process runs them in two lanes
    (`Job.lane`): the deadline jobs in one loop, the sweeps (BookingRepair, the
    rebuild, the prune) in another, so a minute-long sweep never makes a lease
    or an end late.
    """
    every = float(settings.CAPACITY_ROLLUP_EVERY_SECONDS) if every is None else float(every)
    return [
        Job(
            "lease-expire",
            lambda _: services.lease_expire_due(),
            lock="worker:lease-expire",
            deadlines=("lease_expiry",),
        ),
        Job(
            "reservation-settle",
            lambda _: services.reservation_settle_ended(),
            lock="worker:reservation-settle",
            deadlines=("reservation_end",),
        ),
        Job(
            "bookings-advance",
            lambda _: phases.bookings_advance(),
            lock="worker:bookings-advance",
            deadlines=("booking_start", "booking_end"),
        ),
        Job(
            "nodes-stale",
            lambda _: liveness.nodes_mark_stale(),
            lock="worker:nodes-stale",
            deadlines=("node_stale",),
        ),
        Job(
            "bookings-repair",
            lambda _: repair.bookings_repair(),
            lock="worker:bookings-repair",
            every=every,
            on_wake=True,
            lane="sweeps",
        ),
        Job(
            "outbox-deliver",
            lambda _: outbox.outbox_deliver_due(),
            lock="worker:outbox-deliver",
            deadlines=("delivery",),
        ),
        # The one-off `rebuild_rollups` takes the same lock: one rebuild at a time.
        Job(
            "rollup-rebuild",
            lambda progress: rollups.rollup_rebuild_all(progress=progress),
            lock="rollup-reconciler",
            every=every,
            lane="sweeps",
        ),
        Job(
            "rate-windows-prune",
            lambda _: ratelimit.rate_windows_prune(),
            lock="worker:rate-windows-prune",
            every=every,
            lane="sweeps",
        ),
        # Closed hours of usage, written once; due when the next hour's grace has passed
        # (the period starts it on a database that never closed one, and is its safety net).
        Job(
            "usage-close",
            lambda progress: usage.usage_close_due(max_hours=USAGE_HOURS_PER_RUN, progress=progress),
            lock="worker:usage-close",
            deadlines=("usage_close",),
            every=every,
            lane="sweeps",
        ),
    ]


def worker_lanes(jobs: Iterable[Job]) -> list[list[Job]]:
    """The jobs of each lane, in `LANES` order (lanes with no job left out)."""
    jobs = list(jobs)
    lanes = [[job for job in jobs if job.lane == lane] for lane in LANES]
    return [lane for lane in lanes if lane]


def _periodic_of(jobs: Iterable[Job]) -> dict[str, float]:
    return {job.name: job.every for job in jobs if job.every is not None}


# --- what the loop tells its watcher ---------------------------------------------------------


class WorkerObserver(Protocol):
    """What the command shows (a status line and a progress bar on a terminal); tests watch it too."""

    def job_started(self, name: str) -> None: ...

    def job_progress(self, name: str, done: int, total: int) -> None: ...

    def job_finished(self, result: JobResult) -> None: ...

    def sleeping(self, seconds: float, until: datetime | None, reason: str) -> None: ...


class QuietObserver:
    """Shows nothing: the log lines are all there is (off a terminal)."""

    def job_started(self, name: str) -> None:
        pass

    def job_progress(self, name: str, done: int, total: int) -> None:
        pass

    def job_finished(self, result: JobResult) -> None:
        pass

    def sleeping(self, seconds: float, until: datetime | None, reason: str) -> None:
        pass


# --- the loop --------------------------------------------------------------------------------


def _listen_conninfo() -> str:
    """The Django connection's parameters as a psycopg conninfo, for the loop's own LISTEN connection."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in params.items() if isinstance(v, str | int)})


def _parse_time(payload: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(payload.strip())
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


@dataclass
class _Plan:
    due: list[Job]
    # The due jobs that only their period made due (re-checked under their lock).
    periodic_only: set[str]
    wake_at: float  # monotonic
    wake_db: datetime  # the same instant on the database clock
    reason: str


class WorkerLoop:
    """The worker's loop. `run_forever` is the process; `run_once` one pass of every job (`--once`).

    `stop()` (from a signal handler or another thread) ends the loop after the
    job that is running, and interrupts a sleep at once.
    """

    def __init__(
        self,
        *,
        jobs: Sequence[Job] | None = None,
        observer: WorkerObserver | None = None,
        holder: str | None = None,
        rerun_after: float = 1.0,
        release_cooldown: float = RELEASE_REPAIR_SECONDS,
    ) -> None:
        self.jobs = list(jobs) if jobs is not None else worker_jobs()
        self.observer: WorkerObserver = observer or QuietObserver()
        self.holder = holder or worker_holder()
        self.rerun_after = rerun_after
        self.release_cooldown = release_cooldown
        self.passes = 0
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        # When the woken jobs (BookingRepair) are due (monotonic; None: not woken). They run at
        # start too: a notification sent while no worker listened is not lost.
        self._woken_at: float | None = time.monotonic()
        self._woken_ran = float("-inf")
        self._listen: psycopg.Connection[Any] | None = None
        self._last_heartbeat = float("-inf")

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop after the current job; safe from a signal handler and from another thread."""
        self._stop.set()
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"x")

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self._listen_close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def max_sleep(self) -> float:
        return float(settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS)

    # -- one job ---------------------------------------------------------------------------

    def run_job(self, job: Job, *, periodic_only: bool = False) -> JobResult | None:
        """Run `job` under its advisory lock and record it; None when another worker holds the lock.

        With `periodic_only` (only its period made it due), a job another worker
        ran within its period is skipped too. Whatever the job raises is logged,
        recorded and answered as a failed result, never raised.
        """
        key = ADVISORY_LOCK_KEYS[job.lock]
        if not self._try_lock(key):
            self._not_before[job.name] = time.monotonic() + self.rerun_after
            return None
        try:
            if periodic_only and job.every is not None and self._ran_within(job.name, job.every):
                self._not_before[job.name] = time.monotonic() + self.rerun_after
                return None
            return self._run_locked(job)
        finally:
            self._unlock(key)

    def _ran_within(self, name: str, seconds: float) -> bool:
        try:
            return worker_job_ran_within(name=name, seconds=seconds)
        except DatabaseError:
            logger.exception("worker: reading job %s's row failed", name)
            self._recover_connection()
            return False

    def _run_locked(self, job: Job) -> JobResult:
        if job.on_wake:
            # A notification during the run asks for another run.
            self._woken_at = None
        try:
            worker_job_started(name=job.name, holder=self.holder)
        except DatabaseError:
            logger.exception("worker: recording job %s's start failed", job.name)
            self._recover_connection()
        self.observer.job_started(job.name)
        started = time.perf_counter()

        def progress(done: int, total: int) -> None:
            self.observer.job_progress(job.name, done, total)

        try:
            count = int(job.run(progress) or 0)
            error = ""
        except Exception as exc:
            logger.exception("worker job %s failed", job.name)
            count, error = 0, f"{exc.__class__.__name__}: {exc}".strip()
            self._recover_connection()
        seconds = time.perf_counter() - started
        result = JobResult(name=job.name, ok=not error, count=count, seconds=seconds, error=error)
        try:
            worker_job_finished(name=job.name, holder=self.holder, seconds=seconds, count=count, error=error)
        except DatabaseError:
            logger.exception("worker: recording job %s failed", job.name)
            self._recover_connection()
        self._schedule_after(job, ok=result.ok)
        if job.on_wake:
            self._woken_ran = time.monotonic()
        if result.ok and count:
            logger.info("worker: %s: %d in %.3f s", job.name, count, seconds)
        self.observer.job_finished(result)
        return result

    def _schedule_after(self, job: Job, *, ok: bool) -> None:
        now = time.monotonic()
        if ok:
            self._failures.pop(job.name, None)
            self._not_before[job.name] = now + self.rerun_after
            return
        failures = self._failures.get(job.name, 0) + 1
        self._failures[job.name] = failures
        backoff = min(self.max_sleep, float(2 ** min(failures - 1, 16)))
        self._not_before[job.name] = now + max(backoff, self.rerun_after)

    def _try_lock(self, key: int) -> bool:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
                row = cursor.fetchone()
        except DatabaseError:
            logger.exception("worker: taking a job's lock failed")
            self._recover_connection()
            return False
        return bool(row and row[0])

    def _unlock(self, key: int) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        except DatabaseError:
            # The session is gone, and its locks with it.
            logger.exception("worker: releasing a job's lock failed")
            self._recover_connection()

    def _recover_connection(self) -> None:
        """After an error: a connection that no longer works is closed (its session locks go with it)."""
        if connection.in_atomic_block:
            return  # a caller's transaction (tests run the loop inside one) keeps its connection
        if connection.connection is not None and not connection.is_usable():
            connection.close()

    # -- passes ----------------------------------------------------------------------------

    def run_once(self) -> list[JobResult]:
        """One pass of every job, due or not (the `--once` of the command, and the benchmark)."""
        results = []
        started = time.perf_counter()
        for job in self.jobs:
            if self.stopping:
                break
            result = self.run_job(job)
            if result is not None:
                results.append(result)
        self._record_pass(count=len(results), seconds=time.perf_counter() - started)
        self.passes += 1
        return results

    def _record_pass(self, *, count: int, seconds: float) -> None:
        try:
            worker_job_finished(name=HEARTBEAT_ROW, holder=self.holder, seconds=seconds, count=count)
        except DatabaseError:
            logger.exception("worker: recording the pass failed")
            self._recover_connection()
        self._last_heartbeat = time.monotonic()

    def _due_at(self, job: Job, deadlines: Deadlines) -> tuple[datetime | None, datetime | None]:
        """When the job falls due by its deadlines or a wake-up, and when by its period."""
        times = [t for t in (deadlines.of(kind) for kind in job.deadlines) if t is not None]
        if job.on_wake and self._woken_at is not None:
            times.append(deadlines.now + timedelta(seconds=self._woken_at - time.monotonic()))
        periodic = deadlines.periodic.get(job.name) if job.every is not None else None
        return min(times, default=None), periodic

    def plan(self, deadlines: Deadlines) -> _Plan:
        """Which jobs are due now, and when to wake for the next one (capped by the max sleep)."""
        mono_now = time.monotonic()
        due: list[Job] = []
        wake_at = mono_now + self.max_sleep
        reason = "max sleep"
        periodic_only: set[str] = set()
        for job in self.jobs:
            by_deadline, by_period = self._due_at(job, deadlines)
            at = min((t for t in (by_deadline, by_period) if t is not None), default=None)
            if at is None:
                continue
            when = mono_now + (at - deadlines.now).total_seconds()
            when = max(when, self._not_before.get(job.name, float("-inf")))
            if when <= mono_now:
                due.append(job)
                if by_deadline is None or by_deadline > deadlines.now:
                    periodic_only.add(job.name)
            elif when + DEADLINE_MARGIN_SECONDS < wake_at:
                wake_at, reason = when + DEADLINE_MARGIN_SECONDS, job.name
        wake_db = deadlines.now + timedelta(seconds=wake_at - mono_now)
        return _Plan(due=due, periodic_only=periodic_only, wake_at=wake_at, wake_db=wake_db, reason=reason)

    def run_pass(self, jobs: Sequence[Job], *, periodic_only: Iterable[str] = ()) -> list[JobResult]:
        """Run these jobs in order (each under its lock); stop between jobs when asked to."""
        started = time.perf_counter()
        results = []
        recheck = set(periodic_only)
        for job in jobs:
            if self.stopping:
                break
            result = self.run_job(job, periodic_only=job.name in recheck)
            if result is not None:
                results.append(result)
        self._record_pass(count=len(results), seconds=time.perf_counter() - started)
        self.passes += 1
        return results

    def run_forever(self) -> int:
        """Run passes and sleep between them until `stop()`; answer how many passes ran."""
        self._listen_open()
        try:
            while not self.stopping:
                try:
                    self._iterate()
                except Exception:
                    # Whatever went wrong (the database restarting, most likely), the worker stays up.
                    logger.exception("worker: the loop failed; retrying")
                    self._recover_connection()
                    self._sleep_until(time.monotonic() + RECONNECT_SECONDS, None)
        finally:
            self._listen_close()
        return self.passes

    def _iterate(self) -> None:
        """Run what is due, or sleep until something is."""
        close_old_connections()
        deadlines = next_deadline(periodic=_periodic_of(self.jobs))
        plan = self.plan(deadlines)
        if plan.due:
            self.run_pass(plan.due, periodic_only=plan.periodic_only)
            return
        if time.monotonic() - self._last_heartbeat >= min(HEARTBEAT_SECONDS, self.max_sleep):
            self._record_pass(count=0, seconds=0.0)
        self.observer.sleeping(max(0.0, plan.wake_at - time.monotonic()), plan.wake_db, plan.reason)
        self._sleep_until(plan.wake_at, plan.wake_db)

    # -- sleeping and waking ---------------------------------------------------------------

    def _listen_open(self) -> bool:
        if self._listen is not None:
            return True
        try:
            conn = psycopg.connect(_listen_conninfo(), autocommit=True)
            conn.execute(f"LISTEN {WORKER_CHANNEL}")
            if any(job.on_wake for job in self.jobs):
                conn.execute(f"LISTEN {RELEASE_CHANNEL}")
        except psycopg.Error as exc:
            logger.warning("worker: LISTEN failed (%s); sleeping to deadlines until it reconnects", exc)
            return False
        self._listen = conn
        return True

    def _listen_close(self) -> None:
        if self._listen is not None:
            with contextlib.suppress(Exception):
                self._listen.close()
            self._listen = None

    def _notifications(self) -> Iterator[psycopg.Notify]:
        assert self._listen is not None
        yield from self._listen.notifies(timeout=0)

    def _sleep_until(self, wake_at: float, wake_db: datetime | None) -> None:
        """Block until `wake_at` (monotonic), `stop()`, or a notification that changes the plan."""
        while not self.stopping:
            remaining = wake_at - time.monotonic()
            if remaining <= 0:
                return
            if self._listen is None:
                # Without a LISTEN connection, wake to reconnect; a reconnect may have missed
                # notifications, so it replans with the woken jobs due.
                if self._listen_open():
                    self._wake(time.monotonic())
                    return
                remaining = min(remaining, RECONNECT_SECONDS)
            fds = [self._wake_read] + ([self._listen.fileno()] if self._listen is not None else [])
            readable, _, _ = select.select(fds, [], [], remaining)
            if self._wake_read in readable:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_read, 4096)
                return
            if self._listen is None or self._listen.fileno() not in readable:
                continue
            try:
                notes = list(self._notifications())
            except psycopg.Error:
                logger.warning("worker: the LISTEN connection dropped; reconnecting")
                self._listen_close()
                continue
            replan, wake_at = self._on_notifications(notes, wake_at, wake_db)
            if replan:
                return

    def _wake(self, at: float) -> None:
        """The woken jobs are due at `at` (monotonic), or earlier if they already were."""
        self._woken_at = at if self._woken_at is None else min(self._woken_at, at)

    def _on_notifications(
        self, notes: list[psycopg.Notify], wake_at: float, wake_db: datetime | None
    ) -> tuple[bool, float]:
        """Whether these notifications change the plan, and the (maybe earlier) wake-up."""
        replan = False
        woken_jobs = [job for job in self.jobs if job.on_wake]
        serves_deadlines = any(job.deadlines for job in self.jobs)
        for note in notes:
            now = time.monotonic()
            if note.channel == RELEASE_CHANNEL or note.payload == REPAIR_PAYLOAD:
                if not woken_jobs:
                    continue
                # A node that left the schedulable set: repair now. Freed capacity: at-risk
                # reservations may fit now, but a flood of releases repairs once per cooldown.
                cooldown = 0.0 if note.payload == REPAIR_PAYLOAD else self.release_cooldown
                self._wake(max(now, self._woken_ran + cooldown))
                assert self._woken_at is not None
                # A woken job in backoff (or just run) also waits for its turn.
                ready = max(
                    self._woken_at,
                    min(self._not_before.get(job.name, float("-inf")) for job in woken_jobs),
                )
                if ready <= now:
                    replan = True
                else:
                    wake_at = min(wake_at, ready)
                continue
            if not serves_deadlines:
                continue  # a new deadline is the other lane's business
            at = _parse_time(note.payload)
            if at is None or wake_db is None or at < wake_db:
                replan = True
        return replan, wake_at
