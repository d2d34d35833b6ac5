"""`manage.py worker`: it stops cleanly on SIGTERM (and so does its `rebuild_rollups --every` alias), and
`--once` runs every job once and records it."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest

from core.models import WorkerJob
from core.worker_status import HEARTBEAT_ROW
from tests.support.commands import run_command
from tests.support.threads import Worker
from tests.worker.watch import wait_for
from worker.jobs import worker_jobs


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
