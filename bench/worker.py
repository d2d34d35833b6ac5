"""The worker's cost at the bench's fleet: one pass of every job, its schedule query, and its CPU per minute.

`python -m bench` runs this at its largest fleet (10,000 nodes, one million
bookings); `python -m bench.worker --nodes N` builds a fleet of its own and
runs only this.

* **A pass**: `WorkerLoop.run_once()`, every job once whether due or not,
  timed per job, twice: the first catches up whatever fell due since the
  fleet was written, the second is the steady pass. BookingRepair's first
  run scans the whole fleet; the steady one looks where changes named and at
  the marked reservations, as every run does between the scans. The
  whole-fleet scan (every `CAPACITY_REPAIR_FLEET_SCAN_SECONDS`) is then
  timed on its own.
* **The schedule**: `next_deadline()`, the one query the loop runs on each wake.
* **CPU per minute**: `manage.py worker` as its own process for a minute,
  once its start is over (what was due at start has run): its CPU (user +
  system, from `/proc/<pid>/stat`) and that of its database backends (found
  by `application_name`, when the server's processes are readable from
  here). Measured twice: *idle*, on the loaded fleet before any booking is
  written (nothing falls due: the worker wakes once per max sleep), and
  *steady*, with the million bookings, whose starts and ends fall due every
  second or so, as in a fleet in use.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.clock import proc_cpu_seconds
from bench.database import BASE_DIR

IDLE_SECONDS = 60.0
SCHEDULE_SAMPLES = 50
APP_NAME = "bench-worker"
START_SECONDS = 120.0

console = Console()


def worker_pass() -> dict[str, Any]:
    """One pass of every job: the total and each job's seconds, count and outcome."""
    from worker.loop import WorkerLoop

    loop = WorkerLoop(holder="bench")
    try:
        started = time.perf_counter()
        results = loop.run_once()
        total = time.perf_counter() - started
    finally:
        loop.close()
    return {
        "total_s": round(total, 3),
        "jobs": {
            r.name: {"seconds": round(r.seconds, 3), "count": r.count, "ok": r.ok, "error": r.error}
            for r in results
        },
    }


def repair_fleet_scan() -> dict[str, Any]:
    """BookingRepair's whole-fleet scan, once, on the fleet as the passes left it: seconds and changes."""
    from reservations.lifecycle.repair_sweep import bookings_repair

    started = time.perf_counter()
    changed = bookings_repair(fleet=True)
    return {"seconds": round(time.perf_counter() - started, 3), "count": changed}


def schedule_query(samples: int = SCHEDULE_SAMPLES) -> dict[str, float]:
    """`next_deadline()`'s latency (p50, p99) in milliseconds."""
    from worker.deadlines import next_deadline

    runs = []
    for _ in range(samples):
        started = time.perf_counter()
        next_deadline()
        runs.append((time.perf_counter() - started) * 1000)
    runs.sort()
    return {
        "p50_ms": round(statistics.median(runs), 3),
        "p99_ms": round(runs[min(len(runs) - 1, int(len(runs) * 0.99))], 3),
    }


def _backend_pids() -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            [APP_NAME],
        )
        return [row[0] for row in cursor.fetchall()]


def _passes() -> int:
    from core.models import WorkerJob
    from core.worker_status import HEARTBEAT_ROW

    row = WorkerJob.objects.filter(name=HEARTBEAT_ROW).values_list("runs", flat=True).first()
    return int(row or 0)


def _settled(holder_suffix: str) -> bool:
    """The worker's start is over: it wrote its `worker` row, and none of its jobs is running."""
    from django.db.models import F, Q

    from core.models import WorkerJob
    from core.worker_status import HEARTBEAT_ROW

    mine = WorkerJob.objects.filter(holder__endswith=holder_suffix)
    running = mine.filter(Q(last_finished_at__isnull=True) | Q(last_started_at__gt=F("last_finished_at")))
    return mine.filter(name=HEARTBEAT_ROW).exists() and not running.exists()


def worker_cpu(*, database_url: str, seconds: float = IDLE_SECONDS) -> dict[str, Any]:
    """CPU of `manage.py worker` (and of its database backends) over `seconds`, after its first pass."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-not-secret"),
        "DEBUG": "0",
        "PGAPPNAME": APP_NAME,  # libpq's default application_name: how its backends are found
        "DB_CONN_MAX_AGE": "3600",  # the same backends for the whole measurement
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "worker"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    holder_suffix = f":{process.pid}"
    try:
        deadline = time.monotonic() + START_SECONDS
        calm = 0
        while calm < 3:  # settled at three looks in a row, half a second apart
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start")
            calm = calm + 1 if _settled(holder_suffix) else 0
            time.sleep(0.5)
        backends = _backend_pids()
        cpu0 = proc_cpu_seconds(process.pid)
        db0 = [proc_cpu_seconds(pid) for pid in backends]
        passes0 = _passes()
        time.sleep(seconds)
        cpu1 = proc_cpu_seconds(process.pid)
        db1 = [proc_cpu_seconds(pid) for pid in backends]
        passes1 = _passes()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(60)
    worker_s = (cpu1 or 0.0) - (cpu0 or 0.0)
    readable = backends and all(v is not None for v in (*db0, *db1))
    db_s = sum((b or 0.0) - (a or 0.0) for a, b in zip(db0, db1, strict=True)) if readable else None
    per_minute = 60.0 / seconds
    return {
        "seconds": seconds,
        "worker_cpu_s_per_min": round(worker_s * per_minute, 3),
        "db_cpu_s_per_min": round(db_s * per_minute, 3) if db_s is not None else None,
        "passes_per_min": round((passes1 - passes0) * per_minute, 1),
        "backends": len(backends),
    }


def print_worker(size: dict[str, Any]) -> None:
    """The worker's numbers of one fleet size, as tables."""
    worker = size.get("worker")
    if not worker:
        return
    table = Table(title="the worker: one pass of every job")
    table.add_column("job")
    for label in ("first pass", "steady pass"):
        table.add_column(f"{label} s", justify="right")
        table.add_column("did", justify="right")
    first, steady = worker["first_pass"], worker["steady_pass"]
    for name, job in first["jobs"].items():
        again = steady["jobs"].get(name, {})
        mark = "" if job["ok"] else " (failed)"
        table.add_row(
            name + mark,
            f"{job['seconds']:.3f}",
            str(job["count"]),
            f"{again.get('seconds', 0):.3f}",
            str(again.get("count", "")),
        )
    table.add_row("whole pass", f"{first['total_s']:.3f}", "", f"{steady['total_s']:.3f}", "")
    console.print(table)
    scan = worker.get("repair_fleet_scan")
    if scan:
        console.print(
            f"  BookingRepair's whole-fleet scan (every CAPACITY_REPAIR_FLEET_SCAN_SECONDS):"
            f" {scan['seconds']:.3f} s, {scan['count']} changed"
        )
    schedule = worker["schedule"]
    console.print(f"  next_deadline(): p50 {schedule['p50_ms']:.2f} ms, p99 {schedule['p99_ms']:.2f} ms")
    for label in ("idle", "steady"):
        cpu = worker.get(f"cpu_{label}")
        if cpu:
            db = f"{cpu['db_cpu_s_per_min']:.3f}" if cpu["db_cpu_s_per_min"] is not None else "n/a"
            console.print(
                f"  CPU per minute, {label}: worker {cpu['worker_cpu_s_per_min']:.3f} s,"
                f" its database backends {db} s, {cpu['passes_per_min']:.0f} passes"
            )


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.worker --nodes N`: a fleet of its own, and only the worker's measurements."""
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000, help="fleet size (8 GPUs per node)")
    parser.add_argument("--seconds", type=float, default=IDLE_SECONDS, help="how long each CPU run lasts")
    parser.add_argument("--keep-db", action="store_true", help="keep the benchmark database after the run")
    args = parser.parse_args(argv)

    from bench.clock import Clock
    from bench.database import BENCH_DB, database_drop, database_recreate, server_find
    from bench.fleet import django_setup, fleet_build

    clock = Clock()
    server = server_find()
    database_recreate(server=server)
    django_setup(server)
    url = server.url(BENCH_DB)
    measured: dict[str, Any] = {}

    def idle() -> None:
        with clock.step(f"{args.nodes} nodes: the worker idle for {args.seconds:.0f}s"):
            measured["cpu_idle"] = worker_cpu(database_url=url, seconds=args.seconds)

    fleet_build(server=server, nodes=args.nodes, clock=clock, after_load=idle)
    measured.update(worker_measure(database_url=url, nodes=args.nodes, clock=clock, seconds=args.seconds))
    print_worker({"worker": measured})
    if not args.keep_db:
        from django.db import connections

        connections.close_all()
        database_drop(server=server)


def worker_measure(
    *, database_url: str, nodes: int, clock: Any, seconds: float = IDLE_SECONDS
) -> dict[str, Any]:
    """The passes, the schedule query and the steady CPU at a filled fleet."""
    out: dict[str, Any] = {}
    with clock.step(f"{nodes} nodes: the worker, one pass of every job x2"):
        out["first_pass"] = worker_pass()
        out["steady_pass"] = worker_pass()
        out["repair_fleet_scan"] = repair_fleet_scan()
        out["schedule"] = schedule_query()
    with clock.step(f"{nodes} nodes: the worker with the fleet's bookings for {seconds:.0f}s"):
        out["cpu_steady"] = worker_cpu(database_url=database_url, seconds=seconds)
    return out


if __name__ == "__main__":
    main()
