"""The worker's jobs: what each runs, under which lock, what makes it due, and which lane runs it.

`python manage.py worker` (the Procfile's `worker:`) runs them in `worker.loop`;
`worker.deadlines` is the one query that says when each falls due. A job is
due by a deadline in the rows (a lease expiry, an end, a booking's start or
end, a stale heartbeat, a delivery retry, an hour of usage to close, a
maintenance window's start or end), by a
period counted from its last success in its `WorkerJob` row (shared by every
worker: the safety-net rebuild, the rate-window prune and the BookingRepair
sweep, every `CAPACITY_ROLLUP_EVERY_SECONDS`), or by a notification
(BookingRepair: a node left the schedulable set, or capacity was freed).

Several workers may run. Each job runs under its own session advisory lock
(`core.locks.ADVISORY_LOCK_KEYS`, `pg_try_advisory_lock`): a worker that finds
a job's lock taken skips it, so two workers never run one job at once. Every
job's unit of work is its own transaction (and the deadline jobs claim rows
`FOR UPDATE SKIP LOCKED`), so a worker killed mid-pass leaves nothing
half-done, and the next pass (of it or of another worker) finds exactly the
work that is left.

The worker process runs two loops (`LANES`, one thread and two connections
each): the deadline jobs, whose units of work are short, and the sweeps
(BookingRepair, the rebuild, the prune, the usage close), which may take a
minute at a large fleet; a sweep never holds a deadline up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings

from capacity.services import usage_close_due
from core import ratelimit
from reservations.delivery import outbox
from reservations.lifecycle import phases, repair_sweep
from reservations.lifecycle.deadlines import lease_expire_due, reservation_settle_ended
from reservations.maintenance.toggle import maintenance_windows_advance
from reservations.nodes import liveness
from reservations.rollups import recount as rollups

ProgressFn = Callable[[int, int], None]

# The loops of one worker process, each with its own connections: the jobs with deadlines
# (short units of work, due within seconds), and the sweeps (BookingRepair, the rebuild,
# the prune), which may run for a minute at a large fleet and must not hold the deadlines up.
LANES = ("deadlines", "sweeps")
# A backlog of usage hours (a first run over a month of bookings) is closed this many hours
# per run, so the sweeps lane turns over; the deadline is then still due and it goes on.
USAGE_HOURS_PER_RUN = 24 * 7


@dataclass(frozen=True)
class Job:
    """One of the worker's jobs: what it runs, its lock, and what makes it due."""

    name: str
    run: Callable[[ProgressFn | None], int]
    # The name of its key in `core.locks.ADVISORY_LOCK_KEYS`.
    lock: str
    # The kinds of `worker.deadlines.Deadlines` it serves.
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


def _without_progress(run: Callable[[], int]) -> Callable[[ProgressFn | None], int]:
    """A job with no progress to show: the loop's progress callback is not passed on."""
    return lambda _: run()


def _deadline_job(name: str, run: Callable[[], int], *kinds: str) -> Job:
    """A job of the deadlines lane, under its own `worker:<name>` lock, due at these kinds of deadline."""
    return Job(name, _without_progress(run), lock=f"worker:{name}", deadlines=kinds)


def _sweep(
    name: str,
    run: Callable[[ProgressFn | None], int],
    *,
    every: float,
    lock: str | None = None,
    deadlines: tuple[str, ...] = (),
    on_wake: bool = False,
) -> Job:
    """A periodic job of the sweeps lane, under its own `worker:<name>` lock unless `lock` says otherwise."""
    return Job(
        name,
        run,
        lock=lock or f"worker:{name}",
        deadlines=deadlines,
        every=every,
        on_wake=on_wake,
        lane="sweeps",
    )


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
        _deadline_job("lease-expire", lease_expire_due, "lease_expiry"),
        _deadline_job("reservation-settle", reservation_settle_ended, "reservation_end"),
        _deadline_job("bookings-advance", phases.bookings_advance, "booking_start", "booking_end"),
        _deadline_job("nodes-stale", liveness.nodes_mark_stale, "node_stale"),
        # Maintenance windows: nodes into maintenance at the start, out at the end (before
        # BookingRepair, which then sees the nodes as they are).
        _deadline_job("maintenance-windows", maintenance_windows_advance, "maintenance_switch"),
        _sweep("bookings-repair", _without_progress(repair_sweep.bookings_repair), every=every, on_wake=True),
        _deadline_job("outbox-deliver", outbox.outbox_deliver_due, "delivery"),
        # The one-off `rebuild_rollups` takes the same lock: one rebuild at a time.
        _sweep(
            "rollup-rebuild",
            lambda progress: rollups.rollup_rebuild_all(progress=progress),
            every=every,
            lock="rollup-reconciler",
        ),
        _sweep("rate-windows-prune", _without_progress(ratelimit.rate_windows_prune), every=every),
        # Closed hours of usage, written once; due when the next hour's grace has passed
        # (the period starts it on a database that never closed one, and is its safety net).
        _sweep(
            "usage-close",
            lambda progress: usage_close_due(max_hours=USAGE_HOURS_PER_RUN, progress=progress),
            every=every,
            deadlines=("usage_close",),
        ),
    ]


def worker_lanes(jobs: Iterable[Job]) -> list[list[Job]]:
    """The jobs of each lane, in `LANES` order (lanes with no job left out)."""
    jobs = list(jobs)
    lanes = [[job for job in jobs if job.lane == lane] for lane in LANES]
    return [lane for lane in lanes if lane]


def worker_periods(jobs: Iterable[Job]) -> dict[str, float]:
    """The periodic jobs' periods, by job name (what `worker.deadlines.next_deadline` reads them with)."""
    return {job.name: job.every for job in jobs if job.every is not None}
