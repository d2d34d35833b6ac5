"""What the worker's tests watch a loop with: its sleeps and finished jobs, a thread to run it, a NOTIFY."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from django.db import connection

from tests.support.threads import JOIN_SECONDS, Worker
from worker.jobs import JobResult
from worker.loop import WorkerLoop


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
def looping(*loops: WorkerLoop) -> Iterator[list[Worker]]:
    """Each loop's `run_forever()` in a thread with its own connections; stopped and joined on the way out."""
    threads = [Worker(loop.run_forever) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        yield threads
    finally:
        for loop in loops:
            loop.stop()
        for thread in threads:
            thread.join_ok()
        for loop in loops:
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
