"""The worker: its schedule (one query, the earliest deadline of each kind), its wake-ups (a NOTIFY, a
deadline), its locks (two loops never run one job at once), its failures (logged, recorded, the others go
on), the command's stop on SIGTERM, and what `/healthz` and the admin's index say about it."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from core.clock import compute_now
from core.locks import ADVISORY_LOCK_KEYS
from core.models import WorkerJob
from core.worker_status import HEARTBEAT_ROW, worker_job_finished, worker_job_started
from inventory.models import Node, Pool
from reservations.models import Delivery, Reservation
from tests.support.api import post_json, reservation_body
from tests.support.commands import run_command
from tests.support.factories import AllocationFactory, NodeFactory, ReservationFactory
from tests.support.records import book
from tests.support.threads import JOIN_SECONDS, Worker
from worker.jobs import (
    Deadlines,
    Job,
    JobResult,
    WorkerLoop,
    next_deadline,
    worker_jobs,
    worker_lanes,
)

SECOND = timedelta(seconds=1)


class Watcher:
    """A `WorkerObserver` that tests wait on: each sleep and each finished job is an event."""

    def __init__(self) -> None:
        self.asleep = threading.Event()
        self.finished: list[JobResult] = []
        self.lock = threading.Lock()

    def job_started(self, name: str) -> None:
        self.asleep.clear()

    def job_progress(self, name: str, done: int, total: int) -> None:
        pass

    def job_finished(self, result: JobResult) -> None:
        with self.lock:
            self.finished.append(result)

    def sleeping(self, seconds: float, until: datetime | None, reason: str) -> None:
        self.asleep.set()

    def runs_of(self, name: str) -> int:
        with self.lock:
            return sum(1 for result in self.finished if result.name == name)


@contextmanager
def looping(loop: WorkerLoop) -> Iterator[Worker]:
    """`loop.run_forever()` in a thread with its own connections; stopped and joined on the way out."""
    thread = Worker(loop.run_forever)
    thread.start()
    try:
        yield thread
    finally:
        loop.stop()
        thread.join_ok()
        loop.close()


def notify(channel: str, payload: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def wait_for(condition: Callable[[], bool], *, seconds: float = JOIN_SECONDS) -> bool:
    """Poll `condition` until it holds; False if it never did (only a bound on broken runs)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- the schedule ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_next_deadline_reads_the_earliest_deadline_of_each_kind(settings: Any, gpu_node: Node) -> None:
    settings.CAPACITY_NODE_STALE_SECONDS = 120
    now = compute_now()
    pool = gpu_node.pool
    live_lease = ReservationFactory.create(
        pool=pool, state="scheduled", starts_at=now + 60 * SECOND, ends_at=now + 90 * 60 * SECOND,
        lease_seconds=30, lease_expires_at=now + 30 * SECOND,
    )  # fmt: skip
    ReservationFactory.create(
        pool=pool, state="active", starts_at=now - 3600 * SECOND, ends_at=now + 2 * 3600 * SECOND,
        lease_seconds=60, lease_expires_at=now + 50 * SECOND,
    )  # fmt: skip
    # Not live: neither its lease nor its end is a deadline.
    ReservationFactory.create(
        pool=pool, state="released", starts_at=now - 60 * SECOND, ends_at=now + 10 * SECOND,
        lease_seconds=30, lease_expires_at=now + 5 * SECOND,
    )  # fmt: skip
    ReservationFactory.create(pool=pool, state="ended", starts_at=now - 7200 * SECOND, ends_at=now - SECOND)

    holder = ReservationFactory.create(
        pool=pool, state="active", starts_at=now - 4 * 3600 * SECOND, ends_at=now + 5 * 3600 * SECOND
    )
    allocation = AllocationFactory.create(node=gpu_node, reservation=holder)
    devices = list(gpu_node.devices.order_by("uid"))
    book(devices[0], timedelta(hours=1), timedelta(hours=2), allocation=allocation)  # future
    book(devices[1], timedelta(minutes=20), timedelta(hours=3), allocation=allocation)  # future, starts first
    book(devices[2], timedelta(hours=-1), timedelta(minutes=45), allocation=allocation)  # running
    book(devices[3], timedelta(hours=-1), timedelta(minutes=30), allocation=allocation)  # running, ends first
    book(devices[4], timedelta(hours=-3), timedelta(hours=-2), allocation=allocation)  # over: no deadline

    NodeFactory.create(pool=pool, last_heartbeat_at=now - 100 * SECOND)  # the oldest watched heartbeat
    NodeFactory.create(pool=pool, last_heartbeat_at=now - 10 * SECOND)
    NodeFactory.create(pool=pool, connectivity="disconnected", last_heartbeat_at=now - 1000 * SECOND)

    Delivery.objects.create(reservation=live_lease, kind="assign", next_attempt_at=now + 70 * SECOND)
    Delivery.objects.create(reservation=live_lease, kind="shorten", next_attempt_at=now + 7 * SECOND)

    worker_job_finished(name="rollup-rebuild", holder="test", seconds=1, count=1)
    WorkerJob.objects.filter(name="rollup-rebuild").update(last_ok_at=now - 100 * SECOND)

    deadlines = next_deadline(periodic={"rollup-rebuild": 300, "rate-windows-prune": 300})

    assert deadlines.now == now
    assert deadlines.lease_expiry == now + 30 * SECOND
    assert deadlines.reservation_end == now + 90 * 60 * SECOND
    assert deadlines.booking_start == now + 20 * 60 * SECOND
    assert deadlines.booking_end == now + 30 * 60 * SECOND
    assert deadlines.node_stale == now + 20 * SECOND  # 100 s ago + 120 s
    assert deadlines.delivery == now + 7 * SECOND
    # Periodic: the last success plus the period; a job that never succeeded is due now.
    assert deadlines.periodic == {"rollup-rebuild": now + 200 * SECOND, "rate-windows-prune": now}
    assert deadlines.earliest == now


@pytest.mark.django_db
def test_with_nothing_pending_there_is_no_deadline_and_the_loop_sleeps_the_max(settings: Any) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 45
    deadlines = next_deadline(periodic={})
    assert deadlines == Deadlines(
        now=deadlines.now,
        lease_expiry=None,
        reservation_end=None,
        booking_start=None,
        booking_end=None,
        node_stale=None,
        delivery=None,
    )
    assert deadlines.earliest is None
    loop = WorkerLoop(jobs=[job for job in worker_jobs() if job.every is None])
    try:
        plan = loop.plan(deadlines)
    finally:
        loop.close()
    assert plan.due == []
    assert plan.reason == "max sleep"
    assert plan.wake_db == deadlines.now + timedelta(seconds=45)


@pytest.mark.django_db
def test_the_plan_runs_what_is_due_and_wakes_for_the_next_deadline(settings: Any, gpu_node: Node) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    now = compute_now()
    ReservationFactory.create(
        pool=gpu_node.pool, state="active", starts_at=now - 60 * SECOND, ends_at=now + 600 * SECOND,
        lease_seconds=30, lease_expires_at=now - SECOND,
    )  # fmt: skip
    loop = WorkerLoop(jobs=[job for job in worker_jobs() if job.every is None])
    try:
        plan = loop.plan(next_deadline(periodic={}))
    finally:
        loop.close()
    # The lease is overdue: its job runs now. The settlement's deadline is the end, in ten minutes.
    assert [job.name for job in plan.due] == ["lease-expire"]
    assert plan.reason == "reservation-settle"
    assert abs((plan.wake_db - (now + 600 * SECOND)).total_seconds()) < 5


# --- waking ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("channel", "payload"),
    [("worker_wake", "repair"), ("capacity_released", "pool_01jz0000000000000000000000")],
    ids=["repair-notify", "release-notify"],
)
def test_a_repair_or_release_notify_wakes_a_sleeping_loop_to_run_bookingrepair(
    settings: Any, channel: str, payload: str
) -> None:
    # An hour between deadlines: only the notification can wake the loop in time.
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    runs: list[float] = []
    ran_again = threading.Event()

    def probe(_: object) -> int:
        runs.append(time.monotonic())
        if len(runs) >= 2:
            ran_again.set()
        return 1

    watcher = Watcher()
    loop = WorkerLoop(
        jobs=[Job("probe", probe, lock="worker:bookings-repair", on_wake=True)],
        observer=watcher,
        rerun_after=0,
        release_cooldown=0,  # (by default a flood of releases repairs once per few seconds)
    )
    with looping(loop):
        # The woken job runs once at start (a notification sent while no worker listened is not lost).
        assert watcher.asleep.wait(JOIN_SECONDS)
        assert len(runs) == 1
        notify(channel, payload)
        assert ran_again.wait(JOIN_SECONDS), "the notification did not wake the loop"
    assert len(runs) == 2


@pytest.mark.django_db(transaction=True)
def test_a_new_earlier_deadline_announced_on_the_channel_makes_the_loop_replan(
    settings: Any, gpu_node: Node
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    expired = threading.Event()

    def lease_probe(_: object) -> int:
        expired.set()
        return 1

    watcher = Watcher()
    loop = WorkerLoop(
        jobs=[Job("lease-probe", lease_probe, lock="worker:lease-expire", deadlines=("lease_expiry",))],
        observer=watcher,
    )
    with looping(loop):
        assert watcher.asleep.wait(JOIN_SECONDS)  # nothing pending: asleep for an hour
        now = compute_now()
        ReservationFactory.create(
            pool=gpu_node.pool, state="active", starts_at=now, ends_at=now + 3600 * SECOND,
            lease_seconds=30, lease_expires_at=now,
        )  # fmt: skip
        # What a create sends: the ISO time of its nearest deadline.
        notify("worker_wake", now.isoformat())
        assert expired.wait(JOIN_SECONDS), "the loop slept through the new deadline"


@pytest.mark.django_db(transaction=True)
def test_the_loop_sleeps_until_a_lease_expires_and_releases_it(
    settings: Any, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    status, created = post_json(
        owner_client, "reservations/create", reservation_body(owned_pool, "acme", leaseSeconds=30)
    )
    assert status == 201, created
    # The lease runs out two seconds from now; nothing but the schedule wakes the loop for it.
    Reservation.objects.filter(pk=created["id"]).update(lease_expires_at=compute_now() + 2 * SECOND)
    jobs = [job for job in worker_jobs() if job.name == "lease-expire"]
    loop = WorkerLoop(jobs=jobs, observer=Watcher())

    with looping(loop):
        assert wait_for(lambda: Reservation.objects.get(pk=created["id"]).state == "released")

    status, got = post_json(
        owner_client, "reservations/get", {"tenantId": "acme", "reservationId": created["id"]}
    )
    assert status == 200 and got["state"] == "released"
    assert WorkerJob.objects.get(name="lease-expire").last_count == 1


@pytest.mark.django_db(transaction=True)
def test_a_long_sweep_does_not_hold_a_deadline_up(
    settings: Any, owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    status, created = post_json(
        owner_client, "reservations/create", reservation_body(owned_pool, "acme", leaseSeconds=30)
    )
    assert status == 201, created
    inside, finish = threading.Event(), threading.Event()

    def slow_sweep(_: object) -> int:
        inside.set()
        assert finish.wait(JOIN_SECONDS)
        return 0

    jobs = [
        *[job for job in worker_jobs() if job.name == "lease-expire"],
        Job("slow-sweep", slow_sweep, lock="worker:bookings-repair", on_wake=True, lane="sweeps"),
    ]
    lanes = worker_lanes(jobs)
    assert [[job.name for job in lane] for lane in lanes] == [["lease-expire"], ["slow-sweep"]]
    loops = [WorkerLoop(jobs=lane) for lane in lanes]
    threads = [Worker(loop.run_forever) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        assert inside.wait(JOIN_SECONDS)
        # The sweep is running (and will until told); the lease falls due meanwhile.
        Reservation.objects.filter(pk=created["id"]).update(lease_expires_at=compute_now() + SECOND)
        notify("worker_wake", compute_now().isoformat())
        assert wait_for(lambda: Reservation.objects.get(pk=created["id"]).state == "released")
        assert not finish.is_set()
    finally:
        finish.set()
        for loop in loops:
            loop.stop()
        for thread in threads:
            thread.join_ok()
        for loop in loops:
            loop.close()


def test_the_sweeps_run_in_their_own_lane() -> None:
    lanes = worker_lanes(worker_jobs())
    assert [[job.name for job in lane] for lane in lanes] == [
        ["lease-expire", "reservation-settle", "bookings-advance", "nodes-stale", "outbox-deliver"],
        ["bookings-repair", "rollup-rebuild", "rate-windows-prune", "usage-close"],
    ]


# --- locks and failures ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_loops_never_run_the_same_job_at_once(gpu_node: Node) -> None:
    now = compute_now()
    # An overdue lease the probe never releases: the job stays due, and both loops keep trying it.
    ReservationFactory.create(
        pool=gpu_node.pool, state="active", starts_at=now, ends_at=now + 3600 * SECOND,
        lease_seconds=30, lease_expires_at=now - SECOND,
    )  # fmt: skip
    guard = threading.Lock()
    state = {"inside": 0, "most": 0}
    ran_by: dict[str, int] = {}
    loops: list[WorkerLoop] = []

    def probe(_: object) -> int:
        with guard:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
            name = threading.current_thread().name
            ran_by[name] = ran_by.get(name, 0) + 1
        time.sleep(0.01)  # long enough for the other loop to try the lock meanwhile
        with guard:
            state["inside"] -= 1
            if len(ran_by) == 2 and min(ran_by.values()) >= 5:
                for other in loops:
                    other.stop()
        return 1

    for index in range(2):
        loops.append(
            WorkerLoop(
                jobs=[Job("probe", probe, lock="worker:lease-expire", deadlines=("lease_expiry",))],
                holder=f"test:{index}",
                rerun_after=0,
            )
        )
    threads = [Worker(loop.run_forever) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join_ok()
    for loop in loops:
        loop.close()

    assert state["most"] == 1
    assert len(ran_by) == 2 and min(ran_by.values()) >= 5


@pytest.mark.django_db
def test_a_job_that_raises_is_logged_and_recorded_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom(_: object) -> int:
        raise RuntimeError("the node daemon is on fire")

    jobs = [
        Job("boom", boom, lock="worker:bookings-advance"),
        Job("after", lambda _: 3, lock="worker:nodes-stale"),
    ]
    loop = WorkerLoop(jobs=jobs, holder="test:1")
    try:
        with caplog.at_level(logging.ERROR, logger="worker.jobs"):
            results = loop.run_once()
    finally:
        loop.close()

    assert [(r.name, r.ok, r.count) for r in results] == [("boom", False, 0), ("after", True, 3)]
    boom_row = WorkerJob.objects.get(name="boom")
    assert boom_row.last_error == "RuntimeError: the node daemon is on fire"
    assert boom_row.last_ok_at is None and boom_row.runs == 1 and boom_row.holder == "test:1"
    after_row = WorkerJob.objects.get(name="after")
    assert after_row.last_error == "" and after_row.last_count == 3 and after_row.last_ok_at is not None
    # The worker's own row: a pass that ran two jobs.
    assert WorkerJob.objects.get(name=HEARTBEAT_ROW).last_count == 2
    failure = next(r for r in caplog.records if "boom" in r.getMessage())
    assert failure.exc_info is not None and "on fire" in str(failure.exc_info[1])


@pytest.mark.django_db
def test_a_failing_job_backs_off_instead_of_spinning() -> None:
    def boom(_: object) -> int:
        raise RuntimeError("still broken")

    job = Job("boom", boom, lock="worker:bookings-advance", deadlines=("lease_expiry",))
    loop = WorkerLoop(jobs=[job])
    try:
        first = loop.run_job(job)
        deadlines = next_deadline(periodic={})
        plan = loop.plan(replace(deadlines, lease_expiry=deadlines.now - 60 * SECOND))
    finally:
        loop.close()
    assert first is not None and not first.ok
    # Due by its deadline, but not before its backoff: the loop sleeps until then.
    assert plan.due == [] and plan.reason == "boom"


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_lock_another_session_holds_is_skipped() -> None:
    ran: list[int] = []

    def probe(_: object) -> int:
        ran.append(1)
        return 1

    job = Job("probe", probe, lock="worker:lease-expire")
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_LOCK_KEYS["worker:lease-expire"]])
            taken.set()
            assert release.wait(JOIN_SECONDS)
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_KEYS["worker:lease-expire"]])

    holder = Worker(hold)
    holder.start()
    assert taken.wait(JOIN_SECONDS)
    loop = WorkerLoop(jobs=[job])
    try:
        assert loop.run_job(job) is None
        release.set()
        holder.join_ok()
        assert loop.run_job(job) is not None
    finally:
        loop.close()
    assert ran == [1]


@pytest.mark.django_db(transaction=True)
def test_a_periodic_job_another_worker_just_ran_is_not_run_again() -> None:
    ran: list[str] = []

    def chore(who: str) -> Job:
        def run(_: object) -> int:
            ran.append(who)
            return 1

        return Job("chore", run, lock="worker:rate-windows-prune", every=300)

    first, second = WorkerLoop(jobs=[chore("first")]), WorkerLoop(jobs=[chore("second")])
    try:
        # Both planned it as due; the first ran it; the second finds it done under the lock.
        assert first.run_job(first.jobs[0], periodic_only=True) is not None
        assert second.run_job(second.jobs[0], periodic_only=True) is None
    finally:
        first.close()
        second.close()
    assert ran == ["first"]


# --- the command -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "command", [["worker"], ["rebuild_rollups", "--every", "86400"]], ids=["worker", "alias"]
)
def test_the_command_stops_cleanly_on_sigterm(settings: Any, command: list[str]) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600

    def terminate_once_it_ran() -> None:
        assert wait_for(lambda: WorkerJob.objects.filter(name=HEARTBEAT_ROW).exists())
        os.kill(os.getpid(), signal.SIGTERM)

    killer = Worker(terminate_once_it_ran)
    killer.start()
    out = run_command(*command)
    killer.join_ok()
    assert "SIGTERM or Ctrl-C stops it" in out
    assert out.rstrip().splitlines()[-1].startswith("worker stopped after")
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN


@pytest.mark.django_db
def test_worker_once_runs_every_job_and_records_it() -> None:
    out = run_command("worker", "--once")
    names = [job.name for job in worker_jobs()]
    for name in names:
        assert re.search(rf"^{name}: \d+ in [\d.]+s, ok$", out, re.M), out
    rows = {row.name: row for row in WorkerJob.objects.all()}
    assert set(rows) == {*names, HEARTBEAT_ROW}
    assert all(rows[name].last_ok_at is not None and not rows[name].last_error for name in names)


# --- /healthz and the admin ------------------------------------------------------------------


def healthz(client: Client) -> tuple[int, dict[str, Any]]:
    response = client.get("/healthz")
    return response.status_code, response.json()


def age_rows(seconds: float, *names: str) -> None:
    """Make the rows look as if they were written `seconds` ago."""
    then = compute_now() - timedelta(seconds=seconds)
    WorkerJob.objects.filter(name__in=names).update(
        last_started_at=then, last_finished_at=then, last_ok_at=then
    )


@pytest.mark.django_db
def test_healthz_is_503_until_a_worker_has_run(client: Client) -> None:
    status, body = healthz(client)
    assert status == 503
    assert body["status"] == "unavailable" and body["reason"] == "worker has not run yet"


@pytest.mark.django_db
def test_healthz_is_200_with_each_job_when_the_worker_is_fresh_and_503_when_stale(
    client: Client, settings: Any
) -> None:
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 60
    settings.CAPACITY_WORKER_LAG_SECONDS = 30
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:1", seconds=0.2, count=2)
    worker_job_finished(name="lease-expire", holder="host:1", seconds=0.01, count=3)

    status, body = healthz(client)
    assert status == 200, body
    assert body["status"] == "ok"
    assert body["worker"]["holder"] == "host:1" and body["worker"]["passAge"] < 60
    job = body["worker"]["jobs"]["lease-expire"]
    assert job["lastOk"] is not None and job["lag"] == 0 and job["behind"] is False and job["count"] == 3

    # A pass older than the max sleep plus the lag: no worker is running.
    age_rows(100, HEARTBEAT_ROW)
    status, body = healthz(client)
    assert status == 503
    assert body["reason"].startswith("worker: last pass 100 s ago")

    age_rows(70, HEARTBEAT_ROW)  # inside 60 + 30: fresh again
    assert healthz(client)[0] == 200

    # A job that has run for a while (a sweep of a large fleet) is not behind until the same limit.
    worker_job_started(name="rollup-rebuild", holder="host:1")
    WorkerJob.objects.filter(name="rollup-rebuild").update(
        last_started_at=compute_now() - timedelta(seconds=80)
    )
    status, body = healthz(client)
    assert status == 200 and body["worker"]["jobs"]["rollup-rebuild"]["running"] is True
    WorkerJob.objects.filter(name="rollup-rebuild").update(
        last_started_at=compute_now() - timedelta(seconds=95)
    )
    status, body = healthz(client)
    assert status == 503 and body["reason"] == "worker job rollup-rebuild: running for 95 s"


@pytest.mark.django_db
def test_healthz_is_503_when_a_job_has_been_failing_for_longer_than_the_lag(
    client: Client, settings: Any
) -> None:
    settings.CAPACITY_WORKER_LAG_SECONDS = 30
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:1", seconds=0.1, count=1)
    worker_job_finished(name="bookings-advance", holder="host:1", seconds=0.1, count=5)
    age_rows(10, "bookings-advance")
    worker_job_finished(
        name="bookings-advance", holder="host:1", seconds=0.1, count=0, error="DeadlockDetected: x"
    )

    # Failing, but it succeeded 10 s ago: within the lag.
    status, body = healthz(client)
    assert status == 200, body
    assert body["worker"]["jobs"]["bookings-advance"]["lastError"] == "DeadlockDetected: x"

    WorkerJob.objects.filter(name="bookings-advance").update(last_ok_at=compute_now() - timedelta(seconds=45))
    status, body = healthz(client)
    assert status == 503
    assert body["reason"] == "worker job bookings-advance: failing for 45 s: DeadlockDetected: x"
    assert body["worker"]["jobs"]["bookings-advance"]["behind"] is True


def admin_index_from_the_landing_page(client: Client) -> str:
    """Open the landing page and follow its admin link, as an operator would."""
    landing = client.get("/").content.decode()
    link = re.search(r'<a href="([^"]+)">Operator admin</a>', landing)
    assert link, landing
    response = client.get(link.group(1))
    assert response.status_code == 200
    return str(response.content.decode())


@pytest.mark.django_db
def test_the_admin_index_shows_the_worker_and_each_jobs_lag_in_red_when_behind(admin_client: Client) -> None:
    worker_job_finished(name=HEARTBEAT_ROW, holder="host:7", seconds=0.1, count=1)
    worker_job_finished(name="lease-expire", holder="host:7", seconds=0.02, count=4)
    page = admin_index_from_the_landing_page(admin_client)
    panel = page[page.index('id="worker-status"') :]
    assert "on time" in panel and "host:7" in panel
    assert re.search(r'<tr class="worker-on-time">\s*<td>lease-expire</td>', panel)
    assert "Site administration" in page or "Fleet, capacity and reservations" in page  # the apps still there

    age_rows(1000, HEARTBEAT_ROW, "lease-expire")
    worker_job_finished(
        name="lease-expire", holder="host:7", seconds=0.02, count=0, error="OperationalError: gone"
    )
    page = admin_index_from_the_landing_page(admin_client)
    panel = page[page.index('id="worker-status"') :]
    assert 'class="worker-panel behind"' in page
    assert "Behind: worker: last pass 1000 s ago" in panel
    row = re.search(r'<tr class="worker-behind">\s*<td>lease-expire</td>(.*?)</tr>', panel, re.S)
    assert row and "1000 s" in row.group(1) and "OperationalError: gone" in row.group(1)


@pytest.mark.django_db
def test_the_admin_index_asks_for_a_login_first(client: Client) -> None:
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
