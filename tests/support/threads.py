"""Threads with their own database connections, and the lock waits the tests observe between them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connection, connections, transaction

T = TypeVar("T")

# A bound on how long a helper thread may take; it only stops a broken test from hanging.
JOIN_SECONDS = 60


class Worker(threading.Thread):
    """Runs `target` on its own database connection; keeps its backend pid, its result or its exception."""

    def __init__(self, target: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.target_fn = target
        self.result: Any = None
        self.error: BaseException | None = None
        self.pid: int | None = None
        # Set once the pid is known (or the worker failed before it was).
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.ready.set()
            self.result = self.target_fn()
        except BaseException as exc:  # handed to the main thread
            self.error = exc
        finally:
            self.ready.set()
            connections.close_all()

    def finish(self) -> Any:
        """Wait for the end; the target's result (what it raised stays in `error`)."""
        self.join(JOIN_SECONDS)
        assert not self.is_alive(), "worker did not finish"
        return self.result

    def join_ok(self) -> None:
        """Wait for the end and raise what the target raised."""
        self.finish()
        if self.error is not None:
            raise self.error


def workers_run(targets: Iterable[Callable[[], Any]]) -> list[Worker]:
    """A Worker for each target, all started before any is waited for; once every one has finished."""
    workers = [Worker(target) for target in targets]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.finish()
    return workers


def workers_race(targets: Sequence[Callable[[], Any]]) -> list[Worker]:
    """`workers_run`, each worker held at one barrier until all are running, so that they set off together."""
    start = threading.Barrier(len(targets))

    def released(target: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            start.wait(JOIN_SECONDS)
            return target()

        return run

    return workers_run(released(target) for target in targets)


def wait_until_blocked_on_lock(worker: Worker) -> None:
    """Return once the worker's backend is waiting for a lock held by another transaction."""
    assert worker.ready.wait(JOIN_SECONDS)
    deadline = time.monotonic() + JOIN_SECONDS
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [worker.pid])
            row = cursor.fetchone()
        if row and row[0] == "Lock":
            return
        assert worker.is_alive(), f"worker ended without blocking: {worker.error!r}"
        time.sleep(0.01)
    raise AssertionError("the worker never waited on the lock")


def transaction_held_open(
    work: Callable[[], Any], *, commit: threading.Event | None = None
) -> tuple[Worker, threading.Event]:
    """A Worker that runs `work` in a transaction and keeps it open, uncommitted, until `commit` is set.

    Returned, with `commit` (a new event unless one is given), once `work` has run: whatever rows
    `work` wrote or locked stay locked meanwhile. The worker's result is what `work` returned.
    """
    done = threading.Event()
    let_commit = commit if commit is not None else threading.Event()

    def run() -> Any:
        with transaction.atomic():
            result = work()
            done.set()
            assert let_commit.wait(JOIN_SECONDS)
        return result

    worker = Worker(run)
    worker.start()
    deadline = time.monotonic() + JOIN_SECONDS
    while not done.wait(0.01):
        assert worker.is_alive(), f"the transaction ended before it was held: {worker.error!r}"
        assert time.monotonic() < deadline, "the transaction was never held open"
    return worker, let_commit


def started_until_blocked(target: Callable[[], Any]) -> Worker:
    """A Worker started on `target`, returned once its backend waits for a lock another transaction holds."""
    worker = Worker(target)
    worker.start()
    wait_until_blocked_on_lock(worker)
    return worker


class Dealer(Generic[T]):
    """Deals `items` to threads one at a time, in order, each once; `None` when all are dealt."""

    def __init__(self, items: Iterable[T]) -> None:
        self._items = iter(items)
        self._lock = threading.Lock()

    def next(self) -> T | None:
        with self._lock:
            return next(self._items, None)


def threads_run(target: Callable[[], None], count: int, *, seconds: float = JOIN_SECONDS) -> None:
    """Run `target` on `count` daemon threads at once and wait for all; fail if one never ends."""
    threads = [threading.Thread(target=target, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds)
        assert not thread.is_alive(), "a thread never finished"
