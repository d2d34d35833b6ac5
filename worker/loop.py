"""The worker's loop: runs the jobs that are due, then sleeps until the next deadline or a NOTIFY.

`python manage.py worker` runs one `WorkerLoop.run_forever` per lane of
`worker.jobs`. One pass runs every job that is due, in a fixed order; then the
loop asks the database, in ONE query (`worker.deadlines.next_deadline`), when
the next job falls due, and sleeps until then (at most
`CAPACITY_WORKER_MAX_SLEEP_SECONDS`) or until a notification arrives on its
own LISTEN connection. There is no fixed poll.

The notifications: `'repair'` on `WORKER_CHANNEL` (a node left the schedulable
set, or capacity came back to one) makes `bookings-repair` due at once; a
`capacity_released` (capacity freed up, so at-risk reservations may fit now),
or `'repair-later'` (a run left retried moves for the next), makes it due too,
but at most once per `RELEASE_REPAIR_SECONDS`, so a flood of releases repairs
once. Any
other payload on `WORKER_CHANNEL` is the ISO time of a new deadline (what a
create or a renew sends): the loop recomputes its plan when that time is
earlier than the wake-up it planned; an unparsable payload always recomputes.

The database clock is `compute_now()`: the loop converts "deadline minus
compute_now()" into a sleep of the process's monotonic clock, so a deadline is
acted on within the time a pass takes (well inside the 5 s the service
promises), whatever offset the database's clock has.

Each job runs under its advisory lock (`Job.lock`); a worker that finds it
taken skips the job. A periodic job is re-checked under its lock, so a rebuild
another worker just finished is not run again. A job that raises is logged
with its traceback and recorded in its `WorkerJob` row, and the pass goes on
with the other jobs; it is retried after a backoff (1 s, doubling, at most the
max sleep), so a broken job never spins. A job that succeeds is not rerun for
`rerun_after` seconds (1 s), which bounds the loop when work is left behind by
`SKIP LOCKED`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from core.constants import WORKER_CHANNEL
from core.locks import ADVISORY_LOCK_KEYS
from core.postgres.conninfo import conninfo_of
from core.worker_status import (
    HEARTBEAT_ROW,
    worker_holder,
    worker_job_finished,
    worker_job_ran_within,
    worker_job_started,
)
from reservations.waits import RELEASE_CHANNEL
from worker.deadlines import Deadlines, next_deadline
from worker.jobs import Job, JobResult, worker_jobs, worker_periods

logger = logging.getLogger(__name__)

# The notification that asks for BookingRepair (a node or atom left the schedulable set).
REPAIR_PAYLOAD = "repair"
# BookingRepair left retries for a later run: due like a release's wake, after the cooldown.
REPAIR_LATER_PAYLOAD = "repair-later"
# How long the loop waits before reconnecting its LISTEN connection, or retrying a failed plan.
RECONNECT_SECONDS = 1.0
# A deadline is slept to a little past it, so `compute_now()` has passed it when the job looks.
DEADLINE_MARGIN_SECONDS = 0.01
# An idle worker writes its `worker` row at most this often (and at least once per max sleep).
HEARTBEAT_SECONDS = 10.0
# Releases wake BookingRepair (at-risk reservations may fit now) at most once per this
# long after its last run ended: a sweep of every at-risk reservation is not cheap.
RELEASE_REPAIR_SECONDS = 30.0


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
        ran = False
        with self._tolerating("worker: reading job %s's row failed", name):
            ran = worker_job_ran_within(name=name, seconds=seconds)
        return ran

    def _run_locked(self, job: Job) -> JobResult:
        if job.on_wake:
            # A notification during the run asks for another run.
            self._woken_at = None
        with self._tolerating("worker: recording job %s's start failed", job.name):
            worker_job_started(name=job.name, holder=self.holder)
        self.observer.job_started(job.name)
        started = time.perf_counter()
        count, error = self._call(job)
        seconds = time.perf_counter() - started
        result = JobResult(name=job.name, ok=not error, count=count, seconds=seconds, error=error)
        with self._tolerating("worker: recording job %s failed", job.name):
            worker_job_finished(name=job.name, holder=self.holder, seconds=seconds, count=count, error=error)
        self._schedule_after(job, ok=result.ok)
        if job.on_wake:
            self._woken_ran = time.monotonic()
        if result.ok and count:
            logger.info("worker: %s: %d in %.3f s", job.name, count, seconds)
        self.observer.job_finished(result)
        return result

    def _call(self, job: Job) -> tuple[int, str]:
        """Run the job's work, showing its progress: how many it did, and its error ('' if none)."""

        def progress(done: int, total: int) -> None:
            self.observer.job_progress(job.name, done, total)

        try:
            return int(job.run(progress) or 0), ""
        except Exception as exc:
            logger.exception("worker job %s failed", job.name)
            self._recover_connection()
            return 0, f"{exc.__class__.__name__}: {exc}".strip()

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
        row = None
        with self._tolerating("worker: taking a job's lock failed"), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
            row = cursor.fetchone()
        return bool(row and row[0])

    def _unlock(self, key: int) -> None:
        # On an error the session is gone, and its locks with it.
        with self._tolerating("worker: releasing a job's lock failed"), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])

    @contextlib.contextmanager
    def _tolerating(self, message: str, *args: object) -> Iterator[None]:
        """A database error inside is logged with `message` and the connection recovered, never raised."""
        try:
            yield
        except DatabaseError:
            logger.exception(message, *args)
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
        return self.run_pass(self.jobs)

    def _record_pass(self, *, count: int, seconds: float) -> None:
        with self._tolerating("worker: recording the pass failed"):
            worker_job_finished(name=HEARTBEAT_ROW, holder=self.holder, seconds=seconds, count=count)
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
        deadlines = next_deadline(periodic=worker_periods(self.jobs))
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
            conn = psycopg.connect(conninfo_of(connection.alias), autocommit=True)
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
            if note.channel == RELEASE_CHANNEL or note.payload in (REPAIR_PAYLOAD, REPAIR_LATER_PAYLOAD):
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
