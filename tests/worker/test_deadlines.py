"""The worker's schedule: one query answers the earliest deadline of each kind, and the loop's plan of it
(what runs now, what it wakes for, how long it sleeps with nothing pending)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from core.clock import compute_now
from core.models import WorkerJob
from core.worker_status import worker_job_finished
from inventory.models import Node
from reservations.models import Delivery
from tests.support.factories import AllocationFactory, NodeFactory, ReservationFactory
from tests.support.records import book
from worker.deadlines import Deadlines, next_deadline
from worker.jobs import worker_jobs
from worker.loop import WorkerLoop

SECOND = timedelta(seconds=1)


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
    kinds = ("lease_expiry", "reservation_end", "booking_start", "booking_end", "node_stale", "delivery")
    assert deadlines == Deadlines(now=deadlines.now, **dict.fromkeys(kinds))
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
