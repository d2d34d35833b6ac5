"""`rebuild_rollups [--pool ID] [--every [SECONDS]]`: rebuild now; `--every` runs the worker.

The loop that used to run a pass every N seconds is the worker now
(`manage.py worker`), which sleeps to the next deadline instead of polling;
`--every N` stays as an alias of `worker --rebuild-every N`, so an existing
Procfile or unit file keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inventory.models import Pool
from reservations.rollups.recount import rollup_rebuild
from worker.reconciler import reconcile_once


class Command(BaseCommand):
    help = "Rebuild the pool capacity rollups once (--every: run the worker, which rebuilds every N seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pool", help="Rebuild only this pool (once).")
        parser.add_argument(
            "--every",
            type=float,
            nargs="?",
            const=-1.0,
            default=None,
            metavar="SECONDS",
            help="Run the worker (`worker --rebuild-every`); without a value, CAPACITY_ROLLUP_EVERY_SECONDS.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = int(options["verbosity"])
        pool_id: str | None = options["pool"]
        every: float | None = options["every"]
        if pool_id and every is not None:
            raise CommandError("--pool rebuilds once; the loop always rebuilds every pool")
        if pool_id:
            self._rebuild_pool(pool_id)
        elif every is None:
            self._rebuild_once()
        else:
            period = float(settings.CAPACITY_ROLLUP_EVERY_SECONDS) if every < 0 else every
            if period <= 0:
                raise CommandError("--every must be more than 0 seconds")
            self._loop(period)

    def _rebuild_pool(self, pool_id: str) -> None:
        if not Pool.objects.filter(pk=pool_id).exists():
            raise CommandError(f"pool {pool_id} not found")
        rows = rollup_rebuild(pool_id=pool_id)
        gpu = next((r for r in rows if r.resource == "gpu"), None)
        line = f"rebuilt {pool_id}: {len(rows)} rows"
        if gpu is not None:
            line += (
                f", gpu {gpu.allocated} allocated / {gpu.reserved} reserved / {gpu.allocatable} allocatable"
            )
        self.stdout.write(line)

    def _rebuild_once(self) -> None:
        started = time.monotonic()
        seen = {"pools": 0}
        with self._progress() as tick:

            def progress(done: int, total: int) -> None:
                seen["pools"] = total
                tick(done, total)

            ran = reconcile_once(progress=progress)
        if not ran:
            self.stdout.write("another rebuild is running (the worker's or another one); nothing rebuilt")
            return
        self.stdout.write(f"rebuilt {seen['pools']} pools in {time.monotonic() - started:.2f}s")

    def _loop(self, period: float) -> None:
        self.stdout.write(
            f"rebuild_rollups --every is the worker now: running `worker --rebuild-every {period:g}`"
        )
        call_command(
            "worker",
            "--rebuild-every",
            str(period),
            verbosity=self.verbosity,
            stdout=self.stdout,
            stderr=self.stderr,
        )

    @contextmanager
    def _progress(self) -> Iterator[Callable[[int, int], None]]:
        """A rich progress bar per pass on a terminal; plain, quiet progress otherwise."""
        if not self.stdout.isatty():
            yield lambda done, total: None
            return
        from core.progress import progress_bar

        with progress_bar("rebuilding pools") as bar:
            task_ids: list[Any] = []

            def tick(done: int, total: int) -> None:
                if done == 0 or not task_ids:
                    # A new pass: a fresh bar.
                    for task in task_ids:
                        bar.remove_task(task)
                    task_ids[:] = [bar.add_task("pass", total=total)]
                bar.update(task_ids[0], completed=done, total=total)

            yield tick
