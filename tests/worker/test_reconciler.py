"""The one-off reconcile pass (`rebuild_rollups`): one at a time across processes (the advisory lock, shared
with the worker's periodic rebuild), the reservations' pass before the rebuild, and progress."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from core.locks import ADVISORY_LOCK_KEYS
from inventory.models import Node, Pool
from tests.support.factories import NodeFactory, PoolFactory, gpus
from tests.support.records import row
from tests.support.threads import Worker
from worker import reconciler
from worker.jobs import worker_jobs
from worker.loop import WorkerLoop
from worker.reconciler import reconcile_once


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[], None]]]:
    """Steps the reconciler runs, in order, in place of the reservations' pass."""
    steps: list[Callable[[], None]] = []
    monkeypatch.setattr(reconciler, "reservations_reconcile", lambda: [step() for step in list(steps)])
    yield steps


def slow_reservations_pass(hooks: list[Callable[[], None]]) -> tuple[threading.Event, threading.Event]:
    """The reservations' pass waits in a step of its own: `inside` is set there, it goes on at `finish`."""
    inside, finish = threading.Event(), threading.Event()

    def slow_hook() -> None:
        inside.set()
        assert finish.wait(30)

    hooks.append(slow_hook)
    return inside, finish


@pytest.mark.django_db(transaction=True)
def test_the_advisory_lock_lets_only_one_of_two_reconcilers_run(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 2)
    inside, finish = slow_reservations_pass(hooks)
    results: dict[str, bool] = {}
    first = Worker(lambda: results.__setitem__("first", reconcile_once()))
    first.start()
    assert inside.wait(30)
    # The first pass holds the lock: a second replica skips its pass.
    second = Worker(lambda: results.__setitem__("second", reconcile_once()))
    second.start()
    second.join_ok()
    finish.set()
    first.join_ok()
    assert results == {"first": True, "second": False}
    assert row(pool).allocatable == 2
    # Released at the end of the pass: the next one runs.
    hooks.clear()
    assert reconcile_once() is True


@pytest.mark.django_db(transaction=True)
def test_reconcile_once_skips_while_another_session_holds_the_lock(hooks: list[Callable[[], None]]) -> None:
    key = ADVISORY_LOCK_KEYS["rollup-reconciler"]
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [key])
            taken.set()
            assert release.wait(30)
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])

    holder = Worker(hold)
    holder.start()
    assert taken.wait(30)
    assert reconcile_once() is False
    release.set()
    holder.join_ok()
    assert reconcile_once() is True


@pytest.mark.django_db(transaction=True)
def test_the_workers_rebuild_and_a_manual_one_never_run_at_once(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 1)
    inside, finish = slow_reservations_pass(hooks)
    manual = Worker(reconcile_once)
    manual.start()
    assert inside.wait(30)
    (rebuild,) = [job for job in worker_jobs() if job.name == "rollup-rebuild"]
    loop = WorkerLoop(jobs=[rebuild])
    try:
        # The manual pass holds the rebuild's lock: the worker skips its rebuild.
        assert loop.run_job(rebuild) is None
    finally:
        finish.set()
        manual.join_ok()
        loop.close()
    assert manual.result is True


@pytest.mark.django_db
def test_the_reservations_pass_runs_before_the_rebuild_and_a_failing_one_does_not_stop_it(
    hooks: list[Callable[[], None]],
) -> None:
    pool = PoolFactory.create()
    (device,) = gpus(NodeFactory.create(pool=pool), 1)
    calls: list[str] = []

    def cordon_then_fail() -> None:
        calls.append("pass")
        Node.objects.filter(pk=device.node_id).update(cordoned=True)
        raise RuntimeError("boom")

    hooks.append(cordon_then_fail)

    assert reconcile_once() is True

    assert calls == ["pass"]
    assert (row(pool).allocatable, row(pool).maintenance) == (0, 1)


@pytest.mark.django_db
def test_the_pass_rebuilds_and_reports_progress(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 3)
    seen: list[tuple[int, int]] = []

    assert reconcile_once(progress=lambda done, total: seen.append((done, total))) is True

    total = Pool.objects.count()
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert row(pool).allocatable == 3
