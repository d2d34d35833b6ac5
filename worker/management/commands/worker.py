"""`worker [--once] [--rebuild-every SECONDS]`: the always-on worker (the Procfile's `worker:`).

Runs the worker's loops (`worker.loop`, one per lane of `worker.jobs`: the
deadline jobs and the sweeps, each in its own thread with its own connections)
until SIGTERM or Ctrl-C, which stop them after the job each is running (the
same signal twice stops the process at once). Off a terminal it writes plain
log lines: one per job that did something, one with the traceback per
failure. On a terminal it keeps a status line per lane (what it runs, what it
sleeps until) and a progress bar while the rollups are rebuilt. `--once` runs
every job once, one after the other, and exits (1 when a job failed).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.status import Status

from core.progress import progress_bar
from worker.jobs import JobResult, worker_jobs, worker_lanes
from worker.loop import QuietObserver, WorkerLoop, WorkerObserver

# The loop's log lines (one per job that did something, one per failure).
LOGGER = "worker.loop"


class Command(BaseCommand):
    help = "Run the worker: leases, settlement, booking phases, liveness, repair, deliveries, rebuilds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run every job once, then exit.")
        parser.add_argument(
            "--rebuild-every",
            type=float,
            default=None,
            metavar="SECONDS",
            help="The periodic jobs' period (the rebuild); default CAPACITY_ROLLUP_EVERY_SECONDS.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        every: float | None = options["rebuild_every"]
        if every is not None and every <= 0:
            raise CommandError("--rebuild-every must be more than 0 seconds")
        verbosity = int(options["verbosity"])
        logger = logging.getLogger(LOGGER)
        level = logger.level
        logger.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING)
        try:
            if options["once"]:
                self._once(every)
            else:
                self._forever(every)
        finally:
            logger.setLevel(level)

    def _once(self, every: float | None) -> None:
        loop = WorkerLoop(jobs=worker_jobs(every=every))
        try:
            with self._display() as terminal:
                loop.observer = terminal.lane("once") if terminal else QuietObserver()
                results = loop.run_once()
        finally:
            loop.close()
        for result in results:
            state = "ok" if result.ok else f"FAILED: {result.error}"
            self.stdout.write(f"{result.name}: {result.count} in {result.seconds:.2f}s, {state}")
        failed = [r.name for r in results if not r.ok]
        if failed:
            raise CommandError(f"{len(failed)} job(s) failed: {', '.join(failed)}")

    def _forever(self, every: float | None) -> None:
        period = float(settings.CAPACITY_ROLLUP_EVERY_SECONDS) if every is None else every
        lanes = worker_lanes(worker_jobs(every=every))
        loops = [WorkerLoop(jobs=jobs) for jobs in lanes]
        self.stdout.write(
            f"worker {loops[0].holder}: sleeps to the next deadline or a NOTIFY"
            f" (at most {loops[0].max_sleep:g}s), rebuilds every {period:g}s;"
            " SIGTERM or Ctrl-C stops it after the current job"
        )
        restore = _install_stop_handlers(loops)
        try:
            with self._display() as terminal:
                for jobs, loop in zip(lanes, loops, strict=True):
                    loop.observer = terminal.lane(jobs[0].lane) if terminal else QuietObserver()
                passes = _run_lanes(loops)
        except KeyboardInterrupt:
            # The open transactions are rolled back with their connections: nothing half-done.
            raise CommandError(
                "worker: stopped in the middle of a job (its transaction rolled back)", returncode=130
            ) from None
        finally:
            restore()
            for loop in loops:
                loop.close()
        self.stdout.write(f"worker stopped after {passes} pass{'' if passes == 1 else 'es'}")

    @contextmanager
    def _display(self) -> Iterator[_Terminal | None]:
        """A status line per lane and a rebuild bar on a terminal (logs above them); None otherwise."""
        if not self.stdout.isatty():
            yield None
            return
        from rich.logging import RichHandler

        console = Console()
        logger = logging.getLogger(LOGGER)
        handler = RichHandler(console=console, show_path=False)
        logger.addHandler(handler)
        propagate, logger.propagate = logger.propagate, False
        terminal = _Terminal(console)
        try:
            with terminal:
                yield terminal
        finally:
            logger.removeHandler(handler)
            logger.propagate = propagate


def _run_lanes(loops: list[WorkerLoop]) -> int:
    """The first loop in this thread (signals land here), the others in threads of their own.

    When the first returns (it was stopped), the others are stopped and waited
    for: each finishes the job it is running. A KeyboardInterrupt (the same
    signal twice) leaves them: they are daemon threads, gone with the process.
    """
    counts = [0] * len(loops)

    def run(index: int) -> None:
        try:
            counts[index] = loops[index].run_forever()
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(index,), name=f"worker-{index}", daemon=True)
        for index in range(1, len(loops))
    ]
    for thread in threads:
        thread.start()
    try:
        run(0)
    finally:
        for loop in loops:
            loop.stop()
    for thread in threads:
        thread.join()
    return sum(counts)


def _install_stop_handlers(loops: list[WorkerLoop]) -> Callable[[], None]:
    """SIGTERM and SIGINT stop the loops after their current job; the same signal twice stops at once.

    Only the same signal twice: on Ctrl-C under `make run` the worker gets SIGINT
    from the terminal and then SIGTERM from honcho, which must not cut a job short.
    """
    received: set[int] = set()

    def handle(signum: int, frame: FrameType | None) -> None:
        if signum in received:
            raise KeyboardInterrupt
        received.add(signum)
        logging.getLogger(LOGGER).warning("worker: signal %s, stopping after the current job", signum)
        for loop in loops:
            loop.stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


class _Terminal:
    """The worker on a terminal: a status line (a part per lane), or a bar while a job shows progress.

    The lanes call it from their threads; one lock keeps the display whole.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.lock = threading.Lock()
        self.status: Status = console.status("worker: starting")
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.parts: dict[str, str] = {}
        self.last: dict[str, str] = {}

    def __enter__(self) -> _Terminal:
        self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self._bar_stop()
            self.status.stop()

    def lane(self, name: str) -> WorkerObserver:
        return _Lane(self, name)

    def _show(self) -> None:
        self.status.update("worker · " + " | ".join(f"{lane}: {text}" for lane, text in self.parts.items()))

    def _bar_stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar, self.task = None, None
            self.status.start()

    def job_started(self, lane: str, name: str) -> None:
        with self.lock:
            self.parts[lane] = f"running {name}"
            self._show()

    def job_progress(self, lane: str, name: str, done: int, total: int) -> None:
        with self.lock:
            if self.bar is None:
                self.status.stop()
                self.bar = progress_bar(name, console=self.console)
                self.bar.start()
                self.task = self.bar.add_task(name, total=total)
            assert self.task is not None
            self.bar.update(self.task, completed=done, total=total)

    def job_finished(self, lane: str, result: JobResult) -> None:
        with self.lock:
            self._bar_stop()
            self.last[lane] = f"{result.name} {'ok' if result.ok else 'FAILED'}, {result.count}"

    def sleeping(self, lane: str, seconds: float, until: datetime | None, reason: str) -> None:
        with self.lock:
            self.parts[lane] = _status_line(
                seconds=seconds, until=until, reason=reason, last=self.last.get(lane, "")
            )
            self._show()


class _Lane:
    """One lane's view of the terminal (a `WorkerObserver`)."""

    def __init__(self, terminal: _Terminal, lane: str) -> None:
        self.terminal = terminal
        self.name = lane

    def job_started(self, name: str) -> None:
        self.terminal.job_started(self.name, name)

    def job_progress(self, name: str, done: int, total: int) -> None:
        self.terminal.job_progress(self.name, name, done, total)

    def job_finished(self, result: JobResult) -> None:
        self.terminal.job_finished(self.name, result)

    def sleeping(self, seconds: float, until: datetime | None, reason: str) -> None:
        self.terminal.sleeping(self.name, seconds, until, reason)


def _status_line(*, seconds: float, until: datetime | None, reason: str, last: str) -> str:
    """`idle · lease-expire in 12s (14:03:07) · last: reservation-settle ok, 3`."""
    at = f" ({until:%H:%M:%S})" if until is not None else ""
    what = "nothing due, next look" if reason == "max sleep" else reason
    tail = f" · last: {last}" if last else ""
    return f"idle · {what} in {seconds:.0f}s{at}{tail}"
