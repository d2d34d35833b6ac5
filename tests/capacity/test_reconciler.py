"""The reconciler: one pass at a time across replicas (the advisory lock), the reservations' pass before
the rebuild, progress, and a clean stop on SIGTERM (also through `rebuild_rollups --every`)."""

from __future__ import annotations

import io
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from capacity import reconciler
from capacity.reconciler import (
    PassResult,
    install_stop_handlers,
    reconcile_loop,
    reconcile_once,
    reconcile_pass,
)
from core.locks import ADVISORY_LOCK_KEYS
from inventory.models import Node, Pool
from tests.support.factories import NodeFactory, PoolFactory, gpus
from tests.support.records import row
from tests.support.threads import Worker


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[], None]]]:
    """Steps the reconciler runs, in order, in place of the reservations' pass."""
    steps: list[Callable[[], None]] = []
    monkeypatch.setattr(reconciler, "reservations_reconcile", lambda: [step() for step in list(steps)])
    yield steps


@pytest.mark.django_db(transaction=True)
def test_the_advisory_lock_lets_only_one_of_two_reconcilers_run(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 2)
    inside, finish = threading.Event(), threading.Event()

    def slow_hook() -> None:
        inside.set()
        assert finish.wait(30)

    hooks.append(slow_hook)
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

    result = reconcile_pass()

    assert result.ran
    assert calls == ["pass"]
    assert (row(pool).allocatable, row(pool).maintenance) == (0, 1)


@pytest.mark.django_db
def test_the_loop_body_rebuilds_and_reports_progress(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 3)
    seen: list[tuple[int, int]] = []

    result = reconcile_pass(progress=lambda done, total: seen.append((done, total)))

    assert result.ran
    total = Pool.objects.count()
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert row(pool).allocatable == 3


@pytest.mark.django_db
def test_sigterm_stops_the_loop_after_the_current_pass(hooks: list[Callable[[], None]]) -> None:
    pool = PoolFactory.create()
    gpus(NodeFactory.create(pool=pool), 1)
    stop = threading.Event()
    restore = install_stop_handlers(stop)
    passes: list[PassResult] = []

    def on_pass(result: PassResult) -> None:
        passes.append(result)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        # A day between passes: only the signal can end this loop promptly.
        count = reconcile_loop(every=86400, stop=stop, on_pass=on_pass)
    finally:
        restore()
    assert count == 1
    assert stop.is_set()
    assert [p.ran for p in passes] == [True]
    assert row(pool).allocatable == 1
    assert signal.getsignal(signal.SIGTERM) is not None


@pytest.mark.django_db
def test_the_rebuild_rollups_command_loop_exits_cleanly_on_sigterm(
    hooks: list[Callable[[], None]], settings: Any
) -> None:
    PoolFactory.create()
    settings.CAPACITY_ROLLUP_EVERY_SECONDS = 86400

    def terminate() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    hooks.append(terminate)
    out = io.StringIO()
    # `--every` without a value takes the period from the settings.
    call_command("rebuild_rollups", "--every", stdout=out)
    text = out.getvalue()
    assert "a pass every 86400s" in text
    assert "pass done" in text
    assert text.rstrip().endswith("reconciler stopped")
