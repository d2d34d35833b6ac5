"""Where one create and one release spend their time: a per-stage profile through the real views.

`python -m bench` runs this at each fleet size; `python -m bench.profile
--nodes N` builds a fleet of its own and runs only this (`--keep-db` keeps it,
`--reuse-db` profiles the kept one again without rebuilding it).

Each sample is one `reservations/create` (1 GPU, 1 h, the main pool) and its
`reservations/release`, sent through Django's test client: in this process,
so the profile can time the product's own functions, but through the whole
request handler (middleware, URL routing, DRF's authentication, parser and
renderer, the views). What a live server adds on top (the socket, gunicorn)
is the same for every method and is measured by the bench's latency runs
(the 401 answered before any query).

For the duration of the profile, the functions at the seams below are
replaced, at the module attribute their callers look them up by, with a
wrapper that times them; every SQL statement is timed by
`connection.execute_wrapper` and counted to the innermost stage running.
A stage's time excludes the stages nested in it (planning inside the commit's
transaction, the delivery that runs at its COMMIT), so the stages of one
request add up to at most its time; what is left is the framework's own work
(middleware, routing, DRF's dispatch, the test client), shown as its own row.
Nothing in the product is changed: the originals are put back when it ends.

The COMMIT itself is not a statement the wrapper sees (Django commits on the
connection, not through a cursor): its wait is in "commit: transaction"'s
time but not in its SQL milliseconds.

Where the database runs on this machine, the CPU its backend spent on each
request is read from `/proc` (`bench.clock.proc_cpu_seconds`, no statement
sent): the database's share of the work, beside the process's own.

The probes cost CPU of their own (two clocks read per stage and per
statement, about 0.2 to 0.4 ms per create). So every probed create and
release is followed by an unprobed one, the wrappers passing straight through:
the request's CPU that the targets compare (`cpu_p50_ms`) is read from those,
and the probed requests' figure (`probed_cpu_p50_ms`, which the stages add up
to) is kept beside it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.clock import proc_cpu_seconds
from bench.load import one_gpu_hour

SAMPLES = 200
WARMUP = 10
FRAMEWORK = "framework (rest)"
TITLE = "where one create and one release spend their time"

# (module, attribute path, stage). A class method is named "Class.method".
SEAMS: tuple[tuple[str, str, str], ...] = (
    ("core.authentication", "BearerTokenAuthentication.authenticate", "authentication"),
    ("core.api.parsing", "StrictJSONParser.parse", "parsing"),
    ("reservations.api.views", "reservation_request_resolve", "parsing"),
    ("core.api.rpc", "rpc_input", "parsing"),
    ("reservations.request.resolve", "decide_pool", "decision"),
    ("core.api.rpc", "decide_tenant", "decision"),
    ("core.api.rpc", "writes_count", "rate limit"),
    ("core.ratelimit", "writes_count", "rate limit"),
    ("reservations.services", "_existing", "idempotency"),
    ("reservations.placer.commit", "placement_plan", "planning"),
    ("reservations.placer.commit", "plan_commit", "commit: bookings"),
    ("reservations.services", "reservation_cut", "commit: bookings"),
    ("reservations.services", "placement_charge", "commit: charge"),
    ("reservations.services", "_create_once", "commit: transaction"),
    ("reservations.services", "_release_once", "commit: transaction"),
    ("reservations.delivery.outbox", "outbox_deliver_reservation", "delivery"),
    ("reservations.api.views", "reservation_get", "read back"),
    ("reservations.api.views", "reservation_payload", "serialization"),
    ("core.api.parsing", "EscapedJSONRenderer.render", "serialization"),
)

# In the order a request meets them; "commit: transaction" is what the commit's
# transaction does besides booking and charging (BEGIN, the reservation's row,
# the outbox row, the audit row, COMMIT).
STAGES: tuple[str, ...] = (
    "authentication",
    "parsing",
    "decision",
    "rate limit",
    "idempotency",
    "planning",
    "commit: bookings",
    "commit: charge",
    "commit: transaction",
    "delivery",
    "read back",
    "serialization",
)

console = Console()
if not console.is_terminal:
    console = Console(width=130)  # the table whole in a log file


@dataclass
class _Frame:
    stage: str
    started: float
    nested: float = 0.0
    cpu_started: float = 0.0
    cpu_nested: float = 0.0


@dataclass
class _Sample:
    """One request: each stage's own seconds, statements and SQL seconds."""

    seconds: dict[str, float] = field(default_factory=dict)
    # The process's CPU time (`time.process_time`) per stage: Python's work, not the database's.
    cpu: dict[str, float] = field(default_factory=dict)
    statements: dict[str, int] = field(default_factory=dict)
    sql_seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)


class Profiler:
    """A stack of running stages in one thread; each stage is charged its own time only."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.sample = _Sample()
        self.thread = threading.get_ident()
        # Off: every wrapper calls straight through (the unprobed requests).
        self.probing = True

    def reset(self) -> _Sample:
        done, self.sample = self.sample, _Sample()
        self.stack.clear()
        return done

    def _mine(self) -> bool:
        # Only the profiled request's thread (a waiting create's listener thread is not it).
        return self.probing and threading.get_ident() == self.thread

    def wrap(self, stage: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._mine():
                return original(*args, **kwargs)
            frame = _Frame(stage=stage, started=time.perf_counter(), cpu_started=time.process_time())
            self.stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                took = time.perf_counter() - frame.started
                cpu = time.process_time() - frame.cpu_started
                self.stack.pop()
                if self.stack:
                    self.stack[-1].nested += took
                    self.stack[-1].cpu_nested += cpu
                own = self.sample
                own.seconds[stage] = own.seconds.get(stage, 0.0) + took - frame.nested
                own.cpu[stage] = own.cpu.get(stage, 0.0) + cpu - frame.cpu_nested
                own.calls[stage] = own.calls.get(stage, 0) + 1

        return timed

    def statement(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        """`connection.execute_wrapper`: time the statement, count it to the innermost stage."""
        if not self._mine():
            return execute(sql, params, many, context)
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            stage = self.stack[-1].stage if self.stack else FRAMEWORK
            own = self.sample
            own.statements[stage] = own.statements.get(stage, 0) + 1
            own.sql_seconds[stage] = own.sql_seconds.get(stage, 0.0) + took


def _resolve(module_name: str, path: str) -> tuple[Any, str]:
    """The object holding the seam's attribute (a module or a class) and the attribute's name."""
    owner: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    if not hasattr(owner, name):
        raise LookupError(f"the profile's seam {module_name}.{path} is gone: update bench/profile.py")
    return owner, name


@contextmanager
def profiling(profiler: Profiler) -> Iterator[None]:
    """Every seam wrapped and every statement timed, for the duration; then the originals back."""
    from django.db import connection

    replaced: list[tuple[Any, str, Any]] = []
    try:
        for module_name, path, stage in SEAMS:
            owner, name = _resolve(module_name, path)
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            replaced.append((owner, name, original))
            setattr(owner, name, profiler.wrap(stage, original))
        with connection.execute_wrapper(profiler.statement):
            yield
    finally:
        for owner, name, original in reversed(replaced):
            setattr(owner, name, original)


def _host() -> str:
    from django.conf import settings

    for host in settings.ALLOWED_HOSTS:
        if host != "*" and not host.startswith("."):
            return str(host)
    return "localhost"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _summary(
    samples: list[tuple[float, _Sample]],
    cpus: list[float],
    probed_cpus: list[float],
    db_cpus: list[float] | None = None,
) -> dict[str, Any]:
    """p50 and mean of the request and of each stage; a stage's share is its mean over the request's.

    `cpus`: each unprobed request's CPU time in this process (`time.process_time`),
    the figure that travels from machine to machine (the database's work is not
    in it); `probed_cpus`: the same of the probed requests, the stages' whole.
    `db_cpus`: each request's CPU time in its database backend, where readable.
    """
    totals = [total for total, _ in samples]
    mean_total = statistics.fmean(totals)
    stages: dict[str, Any] = {}
    for stage in (*STAGES, FRAMEWORK):
        if stage == FRAMEWORK:
            seconds = [total - sum(s.seconds.values()) for total, s in samples]
        else:
            seconds = [s.seconds.get(stage, 0.0) for _, s in samples]
        statements = [s.statements.get(stage, 0) for _, s in samples]
        sql = [s.sql_seconds.get(stage, 0.0) for _, s in samples]
        stages[stage] = {
            "p50_ms": round(_median(seconds) * 1000, 3),
            "mean_ms": round(statistics.fmean(seconds) * 1000, 3),
            "share": round(statistics.fmean(seconds) / mean_total, 4) if mean_total else 0.0,
            "statements": round(statistics.fmean(statements), 2),
            "sql_p50_ms": round(_median(sql) * 1000, 3),
            "cpu_p50_ms": round(_median([s.cpu.get(stage, 0.0) for _, s in samples]) * 1000, 3),
            "calls": round(statistics.fmean([s.calls.get(stage, 0) for _, s in samples]), 2),
        }
    return {
        "n": len(samples),
        "p50_ms": round(_median(totals) * 1000, 3),
        "mean_ms": round(mean_total * 1000, 3),
        "cpu_p50_ms": round(_median(cpus) * 1000, 3),
        "probed_cpu_p50_ms": round(_median(probed_cpus) * 1000, 3),
        # A mean: the kernel counts a backend's CPU in clock ticks (see `proc_cpu_seconds`).
        "db_cpu_mean_ms": round(statistics.fmean(db_cpus) * 1000, 3) if db_cpus else None,
        "statements": round(statistics.fmean([sum(s.statements.values()) for _, s in samples]), 2),
        # A request's own count: the mean also carries the token's look-up, made again once a
        # second (`AUTH_CACHE_SECONDS`) by whichever request comes then.
        "statements_p50": _median([float(sum(s.statements.values())) for _, s in samples]),
        # The largest excess of the stages' sum over the request's time (never above 0).
        "stages_over_request_ms": round(max(sum(s.seconds.values()) - t for t, s in samples) * 1000, 6),
        "stages": stages,
    }


def profile_run(
    *, token: str, tenant_id: str, pool_id: str, samples: int = SAMPLES, warmup: int = WARMUP
) -> dict[str, Any]:
    """`samples` creates (1 GPU, 1 h) each followed by its release, profiled; `warmup` more first, not kept.

    Each probed pair is followed by an unprobed one, whose CPU is the request's
    figure (`cpu_p50_ms`). Returns `{"create": ..., "release": ...}`, each the
    request's p50 and mean and, per stage, p50 and mean milliseconds, share of
    the request (means), statements per request and SQL p50 (see `_summary`).
    """
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings

    client = Client(SERVER_NAME=_host(), HTTP_AUTHORIZATION=f"Bearer {token}")
    profiler = Profiler()
    kept: dict[str, list[tuple[float, _Sample]]] = {"create": [], "release": []}
    cpus: dict[str, list[float]] = {"create": [], "release": []}
    probed_cpus: dict[str, list[float]] = {"create": [], "release": []}
    db_cpus: dict[str, list[float]] = {"create": [], "release": []}
    connection.ensure_connection()

    def backend_cpu() -> float | None:
        # The connection the requests run on (persistent: the same backend from call to call).
        return proc_cpu_seconds(connection.connection.info.backend_pid) if connection.connection else None

    stamp = f"{time.time_ns():x}"

    def call(method: str, body: dict[str, Any], expect: int, keep: bool) -> tuple[float, dict[str, Any]]:
        profiler.reset()
        db_started = backend_cpu() if profiler.probing else None
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.post(f"/api/compute/reservations/{method}", json.dumps(body), "application/json")
        took, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if keep:
            (probed_cpus if profiler.probing else cpus)[method].append(cpu)
            db_ended = backend_cpu() if profiler.probing else None
            if db_started is not None and db_ended is not None:
                db_cpus[method].append(db_ended - db_started)
        answer: dict[str, Any] = json.loads(response.content)
        if response.status_code != expect:
            raise RuntimeError(f"reservations/{method} answered {response.status_code}: {answer}")
        return took, answer

    def pair(index: int, probing: bool) -> None:
        profiler.probing = probing
        keep = index >= warmup
        body = one_gpu_hour(tenant_id=tenant_id, pool_id=pool_id, key=f"profile-{stamp}-{index}-{probing:d}")
        took, answer = call("create", body, 201, keep)
        if keep and probing:
            kept["create"].append((took, profiler.reset()))
        ref = {"tenantId": tenant_id, "reservationId": answer["id"]}
        took, _ = call("release", ref, 200, keep)
        if keep and probing:
            kept["release"].append((took, profiler.reset()))

    # The bench's own writes are not to be refused by the rate limits it measures the cost of.
    with (
        override_settings(API_WRITES_PER_MINUTE_PER_TOKEN=10**9, API_WRITES_PER_MINUTE_PER_TENANT=10**9),
        profiling(profiler),
    ):
        for index in range(warmup + samples):
            pair(index, probing=True)
            pair(index, probing=False)
    return {
        "samples": samples,
        **{op: _summary(rows, cpus[op], probed_cpus[op], db_cpus[op]) for op, rows in kept.items()},
    }


def print_profile(profile: dict[str, Any], *, title: str = TITLE) -> None:
    """The profile as a table: per stage, share of the request, p50 ms, SQL p50 ms and statements."""
    table = Table(title=f"{title} (p50 of {profile['samples']}; share of the mean)")
    table.add_column("stage", no_wrap=True)
    for op in ("create", "release"):
        table.add_column(f"{op} share", justify="right")
        table.add_column("p50 ms", justify="right")
        table.add_column("SQL ms", justify="right")
        table.add_column("CPU ms", justify="right")
        table.add_column("stmts", justify="right")
    create, release = profile["create"], profile["release"]
    for stage in (*STAGES, FRAMEWORK):
        cells: list[str] = []
        for op in (create, release):
            row = op["stages"][stage]
            if row["calls"] == 0 and stage != FRAMEWORK:
                cells += ["", "", "", "", ""]
            else:
                cpu = "" if stage == FRAMEWORK else f"{row['cpu_p50_ms']:.2f}"
                cells += [
                    f"{row['share'] * 100:.1f} %",
                    f"{row['p50_ms']:.2f}",
                    f"{row['sql_p50_ms']:.2f}",
                    cpu,
                    f"{row['statements']:g}",
                ]
        table.add_row(stage, *cells)
    whole: list[str] = []
    for op in (create, release):
        cpu = f"{op['probed_cpu_p50_ms']:.2f}"
        whole += ["100 %", f"{op['p50_ms']:.2f}", "", cpu, f"{op['statements']:g}"]
    table.add_row("whole request", *whole, style="bold")
    console.print(table)
    console.print(f"  {unprobed_cpu_line(profile)}")
    console.print(f"  {database_cpu_line(profile)}")


def unprobed_cpu_line(profile: dict[str, Any]) -> str:
    """The request's CPU without the probes: the figure the targets compare."""
    create, release = profile["create"], profile["release"]
    return (
        f"CPU per create {create['cpu_p50_ms']:.2f} ms, per release {release['cpu_p50_ms']:.2f} ms"
        f" (p50 of the unprobed requests, each after a probed one; probed: {create['probed_cpu_p50_ms']:.2f}"
        f" and {release['probed_cpu_p50_ms']:.2f} ms)"
    )


def database_cpu_line(profile: dict[str, Any]) -> str:
    """The database backend's CPU per create and per release, or why there is none."""
    create, release = profile["create"]["db_cpu_mean_ms"], profile["release"]["db_cpu_mean_ms"]
    if create is None or release is None:
        return "database CPU: not readable (the server is not a process of this machine)"
    return f"database CPU per create {create:.2f} ms, per release {release:.2f} ms (mean, from /proc)"


def _main_pool() -> tuple[str, str]:
    """The (owner, pool id) of the first exclusive H100 pool: the bench's main pool."""
    from inventory.models import Pool

    pool = Pool.objects.filter(sharing="exclusive", gpu_model="H100").order_by("owner_id", "name").first()
    if pool is None:
        raise RuntimeError("no exclusive H100 pool in the benchmark database")
    return pool.owner_id, pool.pk


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.profile --nodes N`: a fleet of its own (or the kept one), and only the profile."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    fleet_arguments(parser)
    parser.add_argument("--samples", type=int, default=SAMPLES, help="creates + releases profiled")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    args = parser.parse_args(argv)

    from bench.clock import Clock

    clock = Clock()
    with main_pool_ready(nodes=args.nodes, reuse_db=args.reuse_db, keep_db=args.keep_db, clock=clock) as (
        token,
        tenant,
        pool_id,
    ):
        with clock.step(f"profile: {args.samples} creates + releases"):
            profile = profile_run(token=token, tenant_id=tenant, pool_id=pool_id, samples=args.samples)
        print_profile(
            profile, title=f"{args.nodes:,} nodes: where one create and one release spend their time"
        )
        if args.json:
            console.print_json(json.dumps(profile))


def fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """`--nodes`, `--keep-db` and `--reuse-db`: what `main_pool_ready` takes from the command line."""
    parser.add_argument("--nodes", type=int, default=1_000, help="fleet size (8 GPUs per node)")
    parser.add_argument("--keep-db", action="store_true", help="keep the benchmark database after the run")
    parser.add_argument(
        "--reuse-db", action="store_true", help="use the kept benchmark database; build nothing"
    )


@contextmanager
def main_pool_ready(
    *, nodes: int, reuse_db: bool, keep_db: bool, clock: Any
) -> Iterator[tuple[str, str, str]]:
    """A fleet of `nodes` (or the kept one) with Django on it: (a member token, its tenant, the main pool).

    Dropped at the end unless kept or reused. Shared by the commands that
    measure one create and release at a time (`bench.profile`, `bench.binding`).
    """
    from django.db import connections

    from bench.database import BENCH_DB, database_drop, database_recreate, server_find
    from bench.fleet import django_setup, fleet_build, pool_ids, tokens_issue

    server = server_find()
    if not reuse_db:
        database_recreate(server=server)
    django_setup(server)
    if reuse_db:
        tenant, pool_id = _main_pool()
    else:
        from reservations.rollups.recount import rollup_rebuild_all

        fleet = fleet_build(server=server, nodes=nodes, clock=clock)
        with clock.step(f"{nodes} nodes: rebuild_rollups"):
            rollup_rebuild_all()
        tenant, pool_id = pool_ids(fleet)["main"]
    try:
        yield tokens_issue()[tenant], tenant, pool_id
    finally:
        connections.close_all()
        if not keep_db and not reuse_db:
            database_drop(server=server)
        else:
            console.print(f"  kept {BENCH_DB}")


if __name__ == "__main__":
    main()
