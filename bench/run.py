"""`python -m bench`: build fleets, fill them, measure, and write the report.

For each fleet size (1,000 and 10,000 nodes of 8 GPUs, with MIG and
time-slice pools), the bench recreates `bench_capacity`, migrates it, writes
the fleet with `make_fleet` and loads it, fills it with bookings (100 per
node: one million at 10,000 nodes), rebuilds the rollups, and starts gunicorn
against it. It then measures the capacity reads and previews at both sizes,
and at the large size the create + release throughput through HTTP next to
its SQL floor, the rebuild and the timeline, the gunicorn workers' peak
memory, where one create and one release spend their time at each size
(`bench/profile.py`: per stage, through the real views), and the worker
process's cost (`bench/worker.py`: a pass of every job, CPU per minute idle
and with the fleet's bookings).

Everything lands in `docs/benchmarks/results.json`, the charts in
`docs/benchmarks/*.png` and the page `docs/benchmarks.md`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.database import BASE_DIR, BENCH_DB, Server, database_drop, database_recreate, server_find

DOCS = BASE_DIR / "docs"
OUT_DIR = DOCS / "benchmarks"
SIZES = (1_000, 10_000)
BOOKINGS_PER_NODE = 100
READ_SAMPLES = 200
PREVIEW_SAMPLES = 25
TIMELINE_SAMPLES = 25
EARLIEST_SAMPLES = 15
USAGE_SAMPLES = 50
REBUILD_RUNS = 3
CLIENT_LEVELS = (1, 4, 16)
API_SECONDS = 10.0
FLOOR_SECONDS = 5.0

console = Console()


def _django_setup(server: Server) -> None:
    os.environ["DATABASE_URL"] = server.url(BENCH_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    os.environ["DEBUG"] = "0"  # no query log growing with a million rows
    import django

    django.setup()


class Clock:
    """Prints each step's duration, and keeps them for the report."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.steps: dict[str, float] = {}

    def step(self, name: str) -> _Step:
        return _Step(self, name)


class _Step:
    def __init__(self, clock: Clock, name: str) -> None:
        self.clock = clock
        self.name = name

    def __enter__(self) -> None:
        self.t0 = time.monotonic()
        console.print(f"[bold cyan]▶ {self.name}[/]")

    def __exit__(self, *exc: object) -> None:
        took = time.monotonic() - self.t0
        self.clock.steps[self.name] = round(took, 2)
        total = time.monotonic() - self.clock.started
        console.print(f"  [green]✓[/] {self.name}: {took:.1f}s (total {total:.0f}s)")


def _build_fleet(
    *, server: Server, nodes: int, clock: Clock, after_load: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Recreate the database, load a synthetic fleet, run `after_load` (nothing booked yet), fill bookings."""
    from django.core.management import call_command
    from django.db import connections

    from bench.fill import bookings_fill

    connections.close_all()
    with clock.step(f"{nodes} nodes: recreate and migrate {BENCH_DB}"):
        database_recreate(server=server)
        call_command("migrate", verbosity=0, interactive=False)
    with clock.step(f"{nodes} nodes: make_fleet and load it"), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.json"
        with open(os.devnull, "w") as quiet:
            call_command("make_fleet", nodes=nodes, gpus_per_node=8, seed=1, out=str(path), stderr=quiet)
        data = json.loads(path.read_text())
        # Loaded as an operator loads a fleet file: `load_fleet` shows its progress
        # on a terminal and answers the ids as JSON.
        answer = io.StringIO()
        call_command("load_fleet", str(path), stdout=answer)
        ids = json.loads(answer.getvalue())
    if after_load is not None:
        after_load()
    with clock.step(f"{nodes} nodes: fill bookings"):
        filled = bookings_fill(conninfo=server.conninfo(BENCH_DB), target_bookings=nodes * BOOKINGS_PER_NODE)
    console.print(
        f"  {filled.bookings:,} bookings on {filled.atoms:,} GPU-class atoms ({filled.layers} per atom);"
        f" {filled.booked_now:,} booked now, {filled.booked_later:,} start later"
    )
    usage_close = _usage_close(clock, nodes)
    return {"ids": ids, "pools": data["pools"], "fill": filled.__dict__, "usage_close": usage_close}


def _usage_close(clock: Clock, nodes: int) -> dict[str, Any]:
    """Close every finished hour of the filled month as the worker's `usage-close` job does (same function).

    So `usage/hourly` below reads closed hours from the usage table, as it
    would on a service that has run for a month. The fill writes that month
    after the fact, which no service does: a worker that ran before it (the
    idle measurement) closed an empty hour ahead of that history, so the
    usage tables start empty here, as on a database the worker never saw.
    """
    from django.db import connection

    from capacity.models import HourlyUsage, UsageHour
    from capacity.usage import usage_close_due

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE capacity_hourlyusage, capacity_usagehour")
    with clock.step(f"{nodes} nodes: usage-close over the filled month"):
        started = time.perf_counter()
        hours = usage_close_due()
        seconds = time.perf_counter() - started
    rows = HourlyUsage.objects.count()
    console.print(f"  {hours:,} hours closed into {rows:,} usage rows in {seconds:.1f}s")
    return {
        "hours": hours,
        "rows": rows,
        "seconds": round(seconds, 2),
        "closed_hours": UsageHour.objects.count(),
    }


def _usage_bodies(tenant: str) -> dict[str, dict[str, Any]]:
    """`usage/hourly` for one tenant: the 31 days that end with the last closed hour, and the open hour."""
    from capacity.models import UsageHour

    last = UsageHour.objects.order_by("-hour").values_list("hour", flat=True).first()
    open_ms = (int(time.time() * 1000) // 3_600_000) * 3_600_000
    end_ms = int(last.timestamp() * 1000) + 3_600_000 if last else open_ms
    return {
        "usage/hourly": {"tenantId": tenant, "from": end_ms - 31 * 86_400_000, "to": end_ms, "limit": 1000},
        "usage/hourly open hour": {"tenantId": tenant, "from": open_ms, "to": open_ms + 3_600_000},
    }


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


def _tokens() -> dict[str, str]:
    from core.services import token_issue

    return {
        tenant: token_issue(tenant_id=tenant, role="member", name=f"bench {tenant}")[1]
        for tenant in ("acme", "beta", "gamma")
    }


def _pool_ids(fleet: dict[str, Any]) -> dict[str, Any]:
    """The H100 exclusive pool the single-pool measurements use, and every exclusive pool."""
    ids = fleet["ids"]["pools"]
    exclusive = [p for p in fleet["pools"] if p["sharing"] == "exclusive"]
    h100 = next(p for p in exclusive if p["gpuModel"] == "H100")
    return {
        "main": (h100["owner"], ids[f"{h100['owner']}/{h100['name']}"]),
        "exclusive": [(p["owner"], ids[f"{p['owner']}/{p['name']}"]) for p in exclusive],
    }


def _preview_bodies(tenant: str, pool_id: str) -> dict[str, dict[str, Any]]:
    selector = {"vramGiB": {"gte": 80}, "gpuModel": "H100"}
    base = {"tenantId": tenant, "poolId": pool_id, "duration": 3600, "idempotencyKey": "bench-preview"}
    return {
        "1 GPU": {**base, "devices": [{"class": "gpu", "count": 1}]},
        "1 GPU + selector": {**base, "devices": [{"class": "gpu", "count": 1, "selector": selector}]},
        "8 GPUs": {**base, "devices": [{"class": "gpu", "count": 8}]},
        "8 GPUs + selector": {**base, "devices": [{"class": "gpu", "count": 8, "selector": selector}]},
        "gang 4x8": {**base, "devices": [{"class": "gpu", "count": 8}], "gang": {"size": 4}},
        "gang 4x8 + selector": {
            **base,
            "devices": [{"class": "gpu", "count": 8, "selector": selector}],
            "gang": {"size": 4},
        },
    }


def _earliest_bodies(tenant: str, pool_id: str) -> dict[str, dict[str, Any]]:
    """capacity/earliest over the next 7 days: one that fits at once, and two that must wait."""
    base = {"tenantId": tenant, "poolId": pool_id, "idempotencyKey": "bench-earliest", "horizon": "7d"}
    eight = [{"class": "gpu", "count": 8}]
    return {
        "8 GPUs for 1 day": {**base, "devices": eight, "duration": "1d"},
        "8 GPUs for 3 days": {**base, "devices": eight, "duration": "3d"},
        "gang 4x8 for 1 day": {**base, "devices": eight, "duration": "1d", "gang": {"size": 4}},
    }


def _reads(
    *, port: int, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int
) -> dict[str, Any]:
    from bench.load import Client, latency_measure

    tenant, pool_id = pools["main"]
    client = Client(port=port, token=tokens[tenant])
    out: dict[str, Any] = {}
    with clock.step(f"{nodes} nodes: summary and byPool x{READ_SAMPLES}"):
        # The fixed cost of any call on this machine: HTTP, gunicorn, Django and
        # DRF, refused (401) before any query because the bearer token is empty.
        anonymous = Client(port=port, token="")
        out["no credential (401)"] = latency_measure(
            client=anonymous, method="capacity/summary", body=lambda i: {"tenantId": tenant}, n=READ_SAMPLES
        ).as_dict()
        anonymous.close()
        out["summary"] = latency_measure(
            client=client, method="capacity/summary", body=lambda i: {"tenantId": tenant}, n=READ_SAMPLES
        ).as_dict()
        out["byPool"] = latency_measure(
            client=client,
            method="capacity/byPool",
            body=lambda i: {"tenantId": tenant, "poolId": pool_id},
            n=READ_SAMPLES,
        ).as_dict()
    with clock.step(f"{nodes} nodes: preview x{PREVIEW_SAMPLES} per shape"):
        out["preview"] = {}
        for name, body in _preview_bodies(tenant, pool_id).items():
            result = latency_measure(
                client=client, method="capacity/preview", body=_constant(body), n=PREVIEW_SAMPLES
            )
            out["preview"][name] = result.as_dict()
    with clock.step(f"{nodes} nodes: earliest fit over 7 days x{EARLIEST_SAMPLES} per shape"):
        out["earliest"] = {}
        for name, earliest_body in _earliest_bodies(tenant, pool_id).items():
            earliest = latency_measure(
                client=client, method="capacity/earliest", body=_constant(earliest_body), n=EARLIEST_SAMPLES
            ).as_dict()
            # What the search found: how far off the start is, and how many instants the placer was asked at.
            status, answer = client.call("capacity/earliest", earliest_body)
            if status == 200:
                earliest["fits"] = answer["fits"]
                earliest["tried"] = answer["instantsTried"]
                if answer["fits"]:
                    earliest["wait_h"] = round((answer["start"] - answer["searchedFrom"]) / 3_600_000, 1)
            out["earliest"][name] = earliest
    with clock.step(f"{nodes} nodes: timeline 7 days / 336 buckets x{TIMELINE_SAMPLES}"):
        from_ms = (int(time.time() * 1000) // 3_600_000) * 3_600_000 - 3 * 86_400_000
        body = {
            "tenantId": tenant,
            "poolId": pool_id,
            "from": from_ms,
            "to": from_ms + 7 * 86_400_000,
            "stepMinutes": 30,
        }
        out["timeline"] = latency_measure(
            client=client, method="capacity/timeline", body=lambda i: body, n=TIMELINE_SAMPLES
        ).as_dict()
    with clock.step(f"{nodes} nodes: usage/hourly one tenant, 31 days x{USAGE_SAMPLES}"):
        for name, usage_body in _usage_bodies(tenant).items():
            out[name] = latency_measure(
                client=client, method="usage/hourly", body=_constant(usage_body), n=USAGE_SAMPLES
            ).as_dict()
            status, answer = client.call("usage/hourly", usage_body)
            out[name]["rows"] = len(answer.get("rows", [])) if status == 200 else None
    client.close()
    return out


def _constant(body: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
    """The same body for every call of a latency measurement."""
    return lambda _i: body


def _fixed_target(assigned: list[tuple[str, str]]) -> Callable[[int, int], tuple[str, str]]:
    """Client i always books in `assigned[i]`."""
    return lambda client, _op: assigned[client]


def _assign(n: int, pools: dict[str, Any], mode: str) -> list[tuple[str, str]]:
    """The (tenantId, poolId) each of `n` clients books in: all the main pool, or pool i mod P."""
    if mode == "one pool":
        return [pools["main"]] * n
    spread = pools["exclusive"]
    return [spread[i % len(spread)] for i in range(n)]


def _split_atoms(assigned: list[tuple[str, str]], atoms: dict[str, list[Any]]) -> list[list[Any]]:
    """Each pool's free atoms dealt out to the clients booking in it, so no two clients share an atom."""
    out: list[list[Any]] = []
    for index, (_, pool_id) in enumerate(assigned):
        sharing = [i for i, (_, p) in enumerate(assigned) if p == pool_id]
        out.append(atoms[pool_id][sharing.index(index) :: len(sharing)])
    return out


def _throughput(
    *,
    server_info: Server,
    port: int,
    tokens: dict[str, str],
    pools: dict[str, Any],
    clock: Clock,
    label: str,
    log: Any,
) -> dict[str, Any]:
    from bench.floor import ROLLUP_MODES, floor_run, free_atoms
    from bench.load import Client, create_release_run

    out: dict[str, Any] = {"api": {}}
    modes = ("one pool", "spread")
    with clock.step(f"{label}: API create + release, {API_SECONDS:.0f}s per run"):
        for mode in modes:
            for n in CLIENT_LEVELS:
                assigned = _assign(n, pools, mode)
                clients = [Client(port=port, token=tokens[tenant]) for tenant, _ in assigned]
                raced0, replans0 = log("placement lost a race"), log("placement replan")
                passed0 = log("placement passed over")
                result = create_release_run(
                    clients=clients,
                    seconds=API_SECONDS,
                    target=_fixed_target(assigned),
                    run_id=f"{label}-{mode}-{n}".replace(" ", ""),
                )
                for client in clients:
                    client.close()
                row = result.as_dict()
                row["lost_races"] = log("placement lost a race") - raced0
                row["replans"] = log("placement replan") - replans0
                row["passed_over"] = log("placement passed over") - passed0
                out["api"].setdefault(mode, []).append(row)
                console.print(
                    f"  {mode:8} {n:2} clients: {row['creates_per_s']:7.1f} creates/s,"
                    f" p50 {row['create_p50_ms']} ms, lost races {row['lost_races']},"
                    f" passed over {row['passed_over']},"
                    f" replans {row['replans']},"
                    f" NO_CAPACITY {row['no_capacity']}, errors {row['other_errors']}"
                )
    conninfo = server_info.conninfo(BENCH_DB)
    with clock.step(f"{label}: SQL floor, {FLOOR_SECONDS:.0f}s per run"):
        atoms = free_atoms(conninfo=conninfo, pool_ids=[p for _, p in pools["exclusive"]], per_pool=64)
        variants = {"floor": "row", "floor_no_rollup": "none", "floor_delta_log": "log"}
        for key, rollup in variants.items():
            for mode in modes if rollup == "row" else ("one pool",):
                for n in CLIENT_LEVELS:
                    per_client = _split_atoms(_assign(n, pools, mode), atoms)
                    floor = floor_run(
                        conninfo=conninfo,
                        atoms=per_client,
                        seconds=FLOOR_SECONDS,
                        run_id=f"{'abc'[ROLLUP_MODES.index(rollup)]}{n:x}",
                        rollup=rollup,
                    )
                    row = floor.as_dict()
                    out.setdefault(key, {}).setdefault(mode, []).append(row)
                    console.print(f"  {key:16} {mode:8} {n:2} clients: {row['creates_per_s']:7.1f} creates/s")
    return out


def _create_one_client(
    *, port: int, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int
) -> dict[str, Any]:
    """One client's create + release loop in the main pool, at every size: what planning costs as it grows."""
    from bench.load import Client, create_release_run

    assigned = _assign(1, pools, "one pool")
    client = Client(port=port, token=tokens[assigned[0][0]])
    with clock.step(f"{nodes} nodes: create + release, 1 client, {API_SECONDS / 2:.0f}s"):
        result = create_release_run(
            clients=[client], seconds=API_SECONDS / 2, target=_fixed_target(assigned), run_id=f"one-{nodes}"
        )
    client.close()
    row = result.as_dict()
    console.print(f"  1 client: create p50 {row['create_p50_ms']} ms, {row['creates_per_s']:.1f} creates/s")
    return row


def _profile(*, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int) -> dict[str, Any]:
    """Where one create and one release in the main pool spend their time, per stage (`bench/profile.py`)."""
    from bench.profile import SAMPLES, print_profile, profile_run

    tenant, pool_id = pools["main"]
    with clock.step(f"{nodes} nodes: profile of create + release x{SAMPLES}"):
        profile = profile_run(token=tokens[tenant], tenant_id=tenant, pool_id=pool_id, samples=SAMPLES)
    print_profile(profile, title=f"{nodes:,} nodes: where one create and one release spend their time")
    return profile


def main(argv: list[str] | None = None) -> None:
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
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    clock = Clock()
    server = server_find()
    database_recreate(server=server)
    _django_setup(server)
    from bench.server import Gunicorn

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
        worker: dict[str, Any] = {}
        measure_worker = nodes == max(sizes) and args.worker_seconds > 0

        def worker_idle(nodes: int = nodes, worker: dict[str, Any] = worker) -> None:
            from bench.worker import worker_cpu

            with clock.step(f"{nodes} nodes: the worker idle for {args.worker_seconds:.0f}s"):
                worker["cpu_idle"] = worker_cpu(
                    database_url=server.url(BENCH_DB), seconds=args.worker_seconds
                )

        fleet = _build_fleet(
            server=server, nodes=nodes, clock=clock, after_load=worker_idle if measure_worker else None
        )
        rebuild = _rebuild(clock=clock, nodes=nodes)
        tokens = _tokens()
        pools = _pool_ids(fleet)
        log_path = Path(tempfile.gettempdir()) / f"bench-gunicorn-{nodes}.log"
        size: dict[str, Any] = {
            "fill": fleet["fill"],
            "rebuild": rebuild,
            "pools": len(fleet["ids"]["pools"]),
            "usage_close": fleet["usage_close"],
        }
        with Gunicorn(database_url=server.url(BENCH_DB), log_path=log_path) as gunicorn:
            size["reads"] = _reads(port=gunicorn.port, tokens=tokens, pools=pools, clock=clock, nodes=nodes)
            # In this process (the server idle), before the throughput runs churn the tables: every
            # size is profiled on its freshly filled fleet.
            size["profile"] = _profile(tokens=tokens, pools=pools, clock=clock, nodes=nodes)
            size["create_one_client"] = _create_one_client(
                port=gunicorn.port, tokens=tokens, pools=pools, clock=clock, nodes=nodes
            )
            if nodes == max(sizes):
                size["throughput"] = _throughput(
                    server_info=server,
                    port=gunicorn.port,
                    tokens=tokens,
                    pools=pools,
                    clock=clock,
                    label=f"{nodes} nodes",
                    log=gunicorn.log_count,
                )
            size["peak_rss_mb"] = {str(pid): round(rss / 2**20, 1) for pid, rss in gunicorn.peak_rss.items()}
        if measure_worker:
            from bench.worker import worker_measure

            worker.update(
                worker_measure(
                    database_url=server.url(BENCH_DB), nodes=nodes, clock=clock, seconds=args.worker_seconds
                )
            )
            size["worker"] = worker
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
