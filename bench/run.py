"""`python -m bench`: build fleets, fill them, measure, and write the report.

For each fleet size (1,000 and 10,000 nodes of 8 GPUs, with MIG and
time-slice pools), the bench recreates `bench_capacity`, migrates it, writes
the fleet with `make_fleet` and loads it, fills it with bookings (100 per
node: one million at 10,000 nodes), rebuilds the rollups, and starts gunicorn
against it (`bench/fleet.py`). It then measures the capacity reads and
previews at both sizes (`bench/reads.py`), and at the large size the create +
release throughput through HTTP next to its SQL floor (`bench/throughput.py`),
the rebuild and the timeline, the gunicorn workers' peak memory, where one
create and one release spend their time at each size (`bench/profile.py`: per
stage, through the real views) and, at the large size, what they cost in
instructions (`bench/instructions.py`, under callgrind), and the worker process's cost
(`bench/worker.py`: a pass of every job, CPU per minute idle and with the
fleet's bookings).

Everything lands in `docs/benchmarks/results.json`, the charts in
`docs/benchmarks/*.png` and the page `docs/benchmarks.md` (`bench/report.py`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.clock import Clock, console
from bench.database import BASE_DIR, BENCH_DB, Server, database_drop, database_recreate, server_find
from bench.fleet import django_setup, fleet_build, pool_ids, tokens_issue
from bench.reads import reads_measure
from bench.throughput import create_one_client, throughput_measure

DOCS = BASE_DIR / "docs"
OUT_DIR = DOCS / "benchmarks"
SIZES = (1_000, 10_000)
REBUILD_RUNS = 3


def _rebuild(*, clock: Clock, nodes: int) -> dict[str, Any]:
    from reservations.rollups.recount import rollup_rebuild_all

    runs = []
    with clock.step(f"{nodes} nodes: rebuild_rollups x{REBUILD_RUNS}"):
        for _ in range(REBUILD_RUNS):
            t0 = time.perf_counter()
            pools = rollup_rebuild_all()
            runs.append(time.perf_counter() - t0)
    return {
        "pools": pools,
        "runs_s": [round(r, 3) for r in runs],
        "median_s": round(statistics.median(runs), 3),
    }


def _profile(*, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int) -> dict[str, Any]:
    """Where one create and one release in the main pool spend their time, per stage (`bench/profile.py`)."""
    from bench.profile import SAMPLES, print_profile, profile_run

    tenant, pool_id = pools["main"]
    with clock.step(f"{nodes} nodes: profile of create + release x{SAMPLES}"):
        profile = profile_run(token=tokens[tenant], tenant_id=tenant, pool_id=pool_id, samples=SAMPLES)
    print_profile(profile, title=f"{nodes:,} nodes: where one create and one release spend their time")
    return profile


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--sizes", default=",".join(str(s) for s in SIZES), help="fleet sizes, comma-separated"
    )
    parser.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks*")
    parser.add_argument(
        "--worker-seconds",
        type=float,
        default=60.0,
        help="how long the worker's CPU is measured, idle and steady, at the largest fleet (0: skip)",
    )
    parser.add_argument(
        "--keep-db",
        action="store_true",
        help=f"keep {BENCH_DB} (the largest fleet) after the run, to inspect it",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    clock = Clock()
    server = server_find()
    database_recreate(server=server)
    django_setup(server)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        },
        "sizes": {},
    }
    for nodes in sizes:
        worker_seconds = args.worker_seconds if nodes == max(sizes) else 0.0
        size = _size_measure(
            server=server,
            nodes=nodes,
            largest=nodes == max(sizes),
            worker_seconds=worker_seconds,
            clock=clock,
        )
        results["sizes"][str(nodes)] = size
        _print_size(nodes, size)
    results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["steps_s"] = clock.steps
    results["total_s"] = round(time.monotonic() - clock.started, 1)
    from django.db import connections

    connections.close_all()
    if not args.keep_db:
        database_drop(server=server)
    if not args.no_docs:
        from bench.report import report_write

        report_write(results=results, out_dir=OUT_DIR, page=DOCS / "benchmarks.md")
        console.print(f"wrote {DOCS / 'benchmarks.md'} and {OUT_DIR}/")
    console.print(f"[bold]make bench took {results['total_s']:.0f}s[/]")


def _size_measure(
    *, server: Server, nodes: int, largest: bool, worker_seconds: float, clock: Clock
) -> dict[str, Any]:
    """One fleet size: build and fill it, then every measurement taken at that size.

    The worker is measured (`worker_seconds` > 0) idle on the loaded fleet
    before any booking, and again once the server's measurements are done.
    """
    worker: dict[str, Any] = {}

    def worker_idle() -> None:
        from bench.worker import worker_cpu

        with clock.step(f"{nodes} nodes: the worker idle for {worker_seconds:.0f}s"):
            worker["cpu_idle"] = worker_cpu(database_url=server.url(BENCH_DB), seconds=worker_seconds)

    fleet = fleet_build(
        server=server, nodes=nodes, clock=clock, after_load=worker_idle if worker_seconds > 0 else None
    )
    rebuild = _rebuild(clock=clock, nodes=nodes)
    size: dict[str, Any] = {
        "fill": fleet["fill"],
        "rebuild": rebuild,
        "pools": len(fleet["ids"]["pools"]),
        "usage_close": fleet["usage_close"],
    }
    size.update(_served_measure(server=server, fleet=fleet, nodes=nodes, largest=largest, clock=clock))
    if worker_seconds > 0:
        from bench.worker import worker_measure

        worker.update(
            worker_measure(
                database_url=server.url(BENCH_DB), nodes=nodes, clock=clock, seconds=worker_seconds
            )
        )
        size["worker"] = worker
    return size


def _instructions(
    *, server: Server, profile: dict[str, Any], clock: Clock, nodes: int
) -> dict[str, Any] | None:
    """The same create and release counted in instructions, under callgrind (`bench/instructions.py`)."""
    from bench.instructions import instructions_line, instructions_measure

    counted = instructions_measure(clock=clock, nodes=nodes)
    if counted is not None:
        console.print("  " + instructions_line(counted, profile))
        # The database's side of the same requests, on a copy of the server (`bench/db_instructions.py`).
        from bench.db_instructions import database_instructions_line, database_instructions_measure

        database = database_instructions_measure(server=server, clock=clock, nodes=nodes)
        if database is not None:
            counted["database"] = database
            console.print("  " + database_instructions_line(database))
    return counted


def _served_measure(
    *, server: Server, fleet: dict[str, Any], nodes: int, largest: bool, clock: Clock
) -> dict[str, Any]:
    """What is measured with gunicorn serving the fleet: the reads, the profile, the writes, its memory."""
    from bench.server import Gunicorn

    tokens = tokens_issue()
    pools = pool_ids(fleet)
    log_path = Path(tempfile.gettempdir()) / f"bench-gunicorn-{nodes}.log"
    size: dict[str, Any] = {}
    with Gunicorn(database_url=server.url(BENCH_DB), log_path=log_path) as gunicorn:
        size["reads"] = reads_measure(
            port=gunicorn.port, tokens=tokens, pools=pools, clock=clock, nodes=nodes
        )
        # In this process (the server idle), before the throughput runs churn the tables: every
        # size is profiled on its freshly filled fleet.
        size["profile"] = _profile(tokens=tokens, pools=pools, clock=clock, nodes=nodes)
        if largest:
            size["instructions"] = _instructions(
                server=server, profile=size["profile"], clock=clock, nodes=nodes
            )
        size["create_one_client"] = create_one_client(
            port=gunicorn.port, tokens=tokens, pools=pools, clock=clock, nodes=nodes
        )
        if largest:
            size["throughput"] = throughput_measure(
                server_info=server,
                port=gunicorn.port,
                tokens=tokens,
                pools=pools,
                clock=clock,
                label=f"{nodes} nodes",
                log=gunicorn.log_count,
            )
        size["peak_rss_mb"] = {str(pid): round(rss / 2**20, 1) for pid, rss in gunicorn.peak_rss.items()}
    return size


def _print_size(nodes: int, size: dict[str, Any]) -> None:
    table = Table(title=f"{nodes:,} nodes")
    table.add_column("measure")
    table.add_column("p50 ms", justify="right")
    table.add_column("p99 ms", justify="right")
    reads = size["reads"]
    for name in ("summary", "byPool", "timeline", "usage/hourly", "usage/hourly open hour"):
        table.add_row(name, f"{reads[name]['p50_ms']:.2f}", f"{reads[name]['p99_ms']:.2f}")
    for name, row in reads["preview"].items():
        table.add_row(f"preview {name}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}")
    table.add_row("rebuild_rollups (median)", f"{size['rebuild']['median_s'] * 1000:.0f}", "")
    console.print(table)
    console.print(f"  peak RSS per gunicorn worker: {size['peak_rss_mb']} MB")
    from bench.worker import print_worker

    print_worker(size)
