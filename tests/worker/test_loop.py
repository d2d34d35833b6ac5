"""The worker's loop: its wake-ups (a NOTIFY, a deadline), its lanes (a sweep never holds a deadline up),
its locks (two loops never run one job at once) and its failures (logged, recorded, the others go on)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.clock import compute_now
from core.locks import ADVISORY_LOCK_KEYS
from core.models import WorkerJob
from core.worker_status import HEARTBEAT_ROW
from inventory.models import Node, Pool
from reservations.models import Reservation
from tests.support.api import post_json, reservation_body
from tests.support.factories import ReservationFactory
from tests.support.threads import JOIN_SECONDS, Worker
from tests.worker.watch import Watcher, looping, notify, wait_for
from worker.deadlines import next_deadline
from worker.jobs import Job, worker_jobs, worker_lanes
from worker.loop import WorkerLoop

SECOND = timedelta(seconds=1)


# --- waking ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("channel", "payload"),
    [
        ("worker_wake", "repair"),
        ("capacity_released", "pool_01jz0000000000000000000000"),
        ("worker_wake", "repair-later"),
    ],
    ids=["repair-notify", "release-notify", "repair-later-notify"],
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


@pytest.fixture
def leased(settings: Any, owner_client: APIClient, owned_pool: Pool, gpu_node: Node) -> str:
    """The id of a reservation created through the API with a 30 s lease, never renewed here; the loop
    sleeps up to an hour, so only its schedule (or a NOTIFY) can wake it for the lease."""
    settings.CAPACITY_WORKER_MAX_SLEEP_SECONDS = 3600
    status, created = post_json(
        owner_client, "reservations/create", reservation_body(owned_pool, "acme", leaseSeconds=30)
    )
    assert status == 201, created
    return str(created["id"])


def released(reservation_id: str) -> bool:
    return Reservation.objects.get(pk=reservation_id).state == "released"


@pytest.mark.django_db(transaction=True)
def test_the_loop_sleeps_until_a_lease_expires_and_releases_it(leased: str, owner_client: APIClient) -> None:
    # The lease runs out two seconds from now; nothing but the schedule wakes the loop for it.
    Reservation.objects.filter(pk=leased).update(lease_expires_at=compute_now() + 2 * SECOND)
    jobs = [job for job in worker_jobs() if job.name == "lease-expire"]
    loop = WorkerLoop(jobs=jobs, observer=Watcher())

    with looping(loop):
        assert wait_for(lambda: released(leased))

    status, got = post_json(owner_client, "reservations/get", {"tenantId": "acme", "reservationId": leased})
    assert status == 200 and got["state"] == "released"
    assert WorkerJob.objects.get(name="lease-expire").last_count == 1


@pytest.mark.django_db(transaction=True)
def test_a_long_sweep_does_not_hold_a_deadline_up(leased: str) -> None:
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
    with looping(*[WorkerLoop(jobs=lane) for lane in lanes]):
        try:
            assert inside.wait(JOIN_SECONDS)
            # The sweep is running (and will until told); the lease falls due meanwhile.
            Reservation.objects.filter(pk=leased).update(lease_expires_at=compute_now() + SECOND)
            notify("worker_wake", compute_now().isoformat())
            assert wait_for(lambda: released(leased))
            assert not finish.is_set()
        finally:
            finish.set()  # before the loops are joined: the sweep's lane finishes its job first


def test_the_sweeps_run_in_their_own_lane() -> None:
    lanes = worker_lanes(worker_jobs())
    assert [[job.name for job in lane] for lane in lanes] == [
        [
            "lease-expire",
            "reservation-settle",
            "bookings-advance",
            "nodes-stale",
            "maintenance-windows",
            "outbox-deliver",
        ],
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
    with looping(*loops) as threads:
        for thread in threads:
            thread.join_ok()  # the probe stops both loops once each ran it five times

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
        with caplog.at_level(logging.ERROR, logger="worker.loop"):
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
