"""`GET /metrics` at fleet scale: what one Prometheus scrape costs the server.

`python -m bench` measures it at every fleet size (`scrape_measure`, in the
targets table: p50 ≤ 20 ms at 10,000 nodes). `python -m bench.metrics
[--nodes N]` measures it alone: a synthetic fleet of N nodes loaded (no
bookings: a scrape reads no booking), the worker run once (its rows, the
rollups), gunicorn as the Procfile runs it, and 200 scrapes from loopback.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.load import percentile
from bench.targets import SCRAPE_P50_MS

SCRAPES = 200


def scrape_measure(*, port: int, n: int = SCRAPES, warmup: int = 3) -> dict[str, Any]:
    """n scrapes in a row over one kept-alive connection (a Prometheus server's), after a warmup."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    first_ms = 0.0
    samples: list[float] = []
    size = lines = 0
    try:
        for i in range(warmup + n):
            started = time.perf_counter()
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            body = response.read()
            elapsed = (time.perf_counter() - started) * 1000
            if response.status != 200:
                raise RuntimeError(f"GET /metrics answered {response.status}: {body[:200]!r}")
            if i == 0:
                first_ms = elapsed
            if i >= warmup:
                samples.append(elapsed)
            size, lines = len(body), body.count(b"\n")
    finally:
        conn.close()
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p99_ms": round(percentile(samples, 99), 2),
        "first_ms": round(first_ms, 1),
        "bytes": size,
        "lines": lines,
        "n": n,
    }


def _fleet(nodes: int) -> None:
    from django.core.management import call_command

    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as quiet:
        path = Path(tmp) / "fleet.json"
        call_command("make_fleet", nodes=nodes, gpus_per_node=8, seed=1, out=str(path), stderr=quiet)
        call_command("load_fleet", str(path), stdout=io.StringIO(), stderr=quiet)
        call_command("worker", once=True, stdout=io.StringIO(), stderr=quiet)


def run(*, nodes: int) -> dict[str, Any]:
    from bench.clock import Clock
    from bench.database import BENCH_DB, database_drop, database_recreate, server_find
    from bench.fleet import django_setup
    from bench.server import Gunicorn

    server = server_find()
    django_setup(server)
    from django.core.management import call_command
    from django.db import connections

    clock = Clock()
    try:
        with clock.step(f"{nodes} nodes: recreate, migrate, load the fleet, one worker pass"):
            connections.close_all()
            database_recreate(server=server)
            call_command("migrate", verbosity=0, interactive=False)
            _fleet(nodes)
            connections.close_all()
        with tempfile.TemporaryDirectory() as tmp:
            web = Gunicorn(database_url=server.url(BENCH_DB), log_path=Path(tmp) / "gunicorn.log")
            web.start()
            try:
                with clock.step(f"{nodes} nodes: GET /metrics x{SCRAPES}"):
                    result = scrape_measure(port=web.port)
            finally:
                web.stop()
    finally:
        connections.close_all()
        database_drop(server=server)
    return {"nodes": nodes, **result}


def table(result: dict[str, Any]) -> Table:
    out = Table(title=f"GET /metrics at {result['nodes']:,} nodes ({result['n']} scrapes)")
    for column in ("p50 ms", "p99 ms", "first ms", "lines", "bytes", f"target p50 ≤ {SCRAPE_P50_MS:.0f} ms"):
        out.add_column(column, justify="right")
    met = "met" if result["p50_ms"] <= SCRAPE_P50_MS else "missed"
    out.add_row(
        f"{result['p50_ms']:.2f}",
        f"{result['p99_ms']:.2f}",
        f"{result['first_ms']:.1f}",
        f"{result['lines']:,}",
        f"{result['bytes']:,}",
        met,
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print the result as JSON, not a table")
    options = parser.parse_args(argv)
    result = run(nodes=options.nodes)
    if options.json:
        print(json.dumps(result))
    else:
        Console().print(table(result))


if __name__ == "__main__":
    main()
