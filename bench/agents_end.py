"""A booking's end on its node: from the release's answer to the last of its processes gone.

`python -m bench.agents_end` (`--reservations N`, or `BENCH_AGENTS_END_N`; 50
by default): the demo fleet in its own database plus one exclusive pool, the
production web server (gunicorn, 2 workers x 8 threads) and the Procfile's
`agents` process (uvicorn, the long poll), and one real node agent
(`python -m better_compute_agent … --kill-grace 0 run`) reading the shipped
H100 snapshot. For each reservation, one after another: create it (one GPU,
an hour), wait until the agent has made its cgroup, start
`better-compute-agent exec RSV -- sleep 600` in it (as root; `exec` moves
itself into the cgroup, then becomes `sleep`), release it over the API, and
time until that process has exited (its pidfd turns readable) and until its
cgroup is removed. Target: p99 <= 1 s from the release's answer to the
process gone.

The cgroups are the kernel's where root can make a cgroup in the cgroup v2
hierarchy (a fresh directory under the bench's own cgroup, removed at the
end): membership and the kill are then real. Elsewhere the root is a
directory laid out like one (the agent writes `cgroup.procs` itself and ends
the processes it names one by one), and the output says so; without root,
`exec` refuses, so the bench starts `sleep` and writes its pid into the
stand-in the way `exec` would.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.agents import Uvicorn
from bench.agents_end_host import (
    AgentDaemon,
    BenchError,
    Root,
    Workload,
    _kill_all,
    _root_make,
    _wait,
    _workload,
    console,
)
from bench.database import BASE_DIR, database_drop, database_recreate, server_find
from bench.load import Client, percentile
from bench.server import Gunicorn
from core.progress import progress_bar

END_DB = "bench_agents_end"
END_POOL = "agents-end"
GPUS = 8
RESERVATIONS = 50
RESERVATIONS_ENV = "BENCH_AGENTS_END_N"
TARGET_P99_MS = 1000.0
# How long the bench waits for each step before it calls the run failed (none is timed against these).
JOIN_S, HELD_S, GONE_S, REMOVED_S = 30.0, 10.0, 30.0, 10.0
OUT = BASE_DIR / "docs" / "benchmarks" / "agents_end.json"


def _setup(conninfo_url: str) -> dict[str, Any]:
    """Migrate, load the demo fleet plus the agent's empty pool (acme's), and issue the tokens."""
    os.environ["DATABASE_URL"] = conninfo_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-agents-end")
    os.environ["DEBUG"] = "0"
    import django

    django.setup()
    from django.core.management import call_command

    from core.services import token_issue
    from fleets.load import fleet_load
    from inventory.models import Pool
    from reservations.rollups.recount import rollup_rebuild_all

    call_command("migrate", verbosity=0, interactive=False)
    data = json.loads((BASE_DIR / "fleets" / "demo.json").read_text())
    data["pools"].append({"name": END_POOL, "owner": "acme", "gpuModel": "H100", "sharing": "exclusive"})
    fleet_load(data=data)
    rollup_rebuild_all()
    pool = Pool.objects.get(owner_id="acme", name=END_POOL)
    _, agent = token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk, name="bench agents end")
    owner = token_issue(tenant_id="acme", role="member", name="bench agents end owner")[1]
    return {"pool": pool.pk, "agent": agent, "owner": owner}


# --- the cgroup root ----------------------------------------------------------------------------


def _one(
    *, index: int, client: Client, agent: AgentDaemon, root: Root, pool: str, workloads: list[Workload]
) -> dict[str, float]:
    """Create, wait until held, start the workload, release; the times of each step, in ms."""
    body = {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": f"agents-end-{os.getpid()}-{index}",
    }
    status, made = client.call("reservations/create", body)
    if status != 201:
        raise BenchError(f"create {index}: {status} {made}")
    created = time.monotonic()
    rid = made["id"]
    cgroup = root.path / rid
    _wait(cgroup.is_dir, seconds=HELD_S, what=f"the agent made {cgroup}", agent=agent)
    held = time.monotonic()
    workload = _workload(agent=agent, root=root, reservation_id=rid)
    workloads.append(workload)
    asked = time.monotonic()
    status, answer = client.call("reservations/release", {"tenantId": "acme", "reservationId": rid})
    answered = time.monotonic()
    if status != 200:
        raise BenchError(f"release {rid}: {status} {answer}")
    exited = workload.wait(GONE_S)
    if exited is None:
        raise BenchError(
            f"{rid}: its workload (pid {workload.process.pid}) still runs"
            f" {GONE_S:.0f} s after the release\n{agent.tail()}"
        )
    _wait(lambda: not cgroup.exists(), seconds=REMOVED_S, what=f"the agent removed {cgroup}", agent=agent)
    removed = time.monotonic()
    return {
        "held_ms": (held - created) * 1000,
        "release_call_ms": (answered - asked) * 1000,
        "gone_ms": (exited - answered) * 1000,
        "removed_ms": (removed - answered) * 1000,
    }


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(max(values), 2),
    }


def _measure(*, setup: dict[str, Any], url: str, reservations: int, scratch: Path) -> dict[str, Any]:
    """The servers, the root and the agent up; the bookings, one after another; all of it gone after."""
    logs = Path(tempfile.gettempdir())
    with ExitStack() as stack:
        uvicorn = Uvicorn(database_url=url, log_path=logs / "bench-agents-end-uvicorn.log")
        stack.callback(uvicorn.stop)
        uvicorn.start()
        gunicorn = Gunicorn(
            database_url=url, log_path=logs / "bench-agents-end-gunicorn.log", workers=2, threads=8
        )
        stack.callback(gunicorn.stop)
        os.environ["AGENT_ASSIGNMENTS_URL"] = f"http://127.0.0.1:{uvicorn.port}"
        try:
            gunicorn.start()
        finally:
            del os.environ["AGENT_ASSIGNMENTS_URL"]
        root = _root_make(scratch)
        stack.callback(root.remove)
        agent = AgentDaemon(
            url=f"http://127.0.0.1:{gunicorn.port}",
            token=setup["agent"],
            pool=setup["pool"],
            directory=scratch,
            cgroup_root=root.path,
        )
        workloads: list[Workload] = []
        # Unwound in reverse: the workloads killed, then the agent stopped, then the root removed.
        stack.callback(agent.stop)
        stack.callback(_kill_all, workloads)
        agent.start()
        client = Client(port=gunicorn.port, token=setup["owner"])
        stack.callback(client.close)

        def joined() -> bool:
            status, body = client.call("capacity/byPool", {"tenantId": "acme", "poolId": setup["pool"]})
            rows = {row["resource"]: row for row in body.get("rows", [])} if status == 200 else {}
            return rows.get("gpu", {}).get("allocatable") == GPUS

        _wait(joined, seconds=JOIN_S, what=f"{GPUS} GPUs allocatable in {END_POOL}", agent=agent)
        steps: list[dict[str, float]] = []
        with progress_bar("bookings ended", console=console) as bar:
            task = bar.add_task("", total=reservations)
            for index in range(reservations):
                steps.append(
                    _one(
                        index=index,
                        client=client,
                        agent=agent,
                        root=root,
                        pool=setup["pool"],
                        workloads=workloads,
                    )
                )
                bar.advance(task)
        terminated = _count(agent.log_path, ": ended; SIGTERM to ")
        killed = _count(agent.log_path, ": grace over; killed what was left")
    gone = [s["gone_ms"] for s in steps]
    p99 = percentile(gone, 99)
    return {
        "cgroups": {"real": root.real, "root": str(root.path), "what": root.why},
        "exec": os.geteuid() == 0,
        "reservations": reservations,
        "gone": {**_stats(gone), "target_p99_ms": TARGET_P99_MS, "met": p99 <= TARGET_P99_MS},
        "gone_before_answer": sum(1 for ms in gone if ms <= 0),
        "removed": _stats([s["removed_ms"] for s in steps]),
        "release_call": _stats([s["release_call_ms"] for s in steps]),
        "held": _stats([s["held_ms"] for s in steps]),
        "agent_log": {"sigterm": terminated, "sigkill": killed},
    }


def _count(path: Path, needle: str) -> int:
    try:
        return sum(1 for line in path.read_text(errors="replace").splitlines() if needle in line)
    except OSError:
        return 0


def run(*, reservations: int, keep_db: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    server = server_find()
    database_recreate(server=server, dbname=END_DB)
    scratch = Path(tempfile.mkdtemp(prefix="bench-agents-end-"))
    try:
        setup = _setup(server.url(END_DB))
        measured = _measure(setup=setup, url=server.url(END_DB), reservations=reservations, scratch=scratch)
    finally:
        from django.db import connections

        connections.close_all()
        if not keep_db:
            database_drop(server=server, dbname=END_DB)
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "kill_grace_s": 0,
        **measured,
        "total_s": round(time.monotonic() - started, 1),
    }


def table(result: dict[str, Any]) -> Table:
    """The run's numbers, one measurement a row, with the target and its verdict."""
    n = result["reservations"]
    out = Table(title=f"a booking's end on its node: {n} releases, kill grace 0 ({result['total_s']:.0f} s)")
    for column in ("from the release's answer", "p50", "p99", "max", "target", ""):
        out.add_column(column)
    g, r, c, h = (result[k] for k in ("gone", "removed", "release_call", "held"))
    verdict = "[green]met[/]" if g["met"] else "[red]not met[/]"
    out.add_row(
        "to its process gone",
        f"{g['p50_ms']} ms",
        f"{g['p99_ms']} ms",
        f"{g['max_ms']} ms",
        "p99 <= 1 s",
        verdict,
    )
    out.add_row(
        "to its cgroup removed", f"{r['p50_ms']} ms", f"{r['p99_ms']} ms", f"{r['max_ms']} ms", "", ""
    )
    out.add_row(
        "(the release call itself)", f"{c['p50_ms']} ms", f"{c['p99_ms']} ms", f"{c['max_ms']} ms", "", ""
    )
    out.add_row(
        "(create's answer to its cgroup made)",
        f"{h['p50_ms']} ms",
        f"{h['p99_ms']} ms",
        f"{h['max_ms']} ms",
        "",
        "",
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agents_end", description=__doc__)
    parser.add_argument(
        "--reservations",
        type=int,
        default=int(os.environ.get(RESERVATIONS_ENV) or RESERVATIONS),
        help=f"bookings ended, one after another (default {RESERVATIONS}, or ${RESERVATIONS_ENV})",
    )
    parser.add_argument("--keep-db", action="store_true", help=f"keep {END_DB} after the run")
    parser.add_argument("--no-docs", action="store_true", help=f"print only; do not write {OUT}")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C: the workloads, the agent and the servers stop, the cgroups go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run(reservations=args.reservations, keep_db=args.keep_db)
    except BenchError as exc:
        console.print(f"[red]agents_end: {exc}[/]")
        sys.exit(1)
    cgroups = result["cgroups"]
    console.print(
        f"cgroups: {cgroups['what']}" + ("" if cgroups["real"] else " [yellow](not the kernel's)[/]")
    )
    if not result["exec"]:
        console.print("[yellow]not root: the workloads were put in the stand-in by the bench, not by exec[/]")
    console.print(table(result))
    log = result["agent_log"]
    console.print(
        f"the agent's log: {log['sigterm']} SIGTERMs sent, {log['sigkill']} SIGKILLs after the grace;"
        f" {result['gone_before_answer']} processes gone before the release's answer came back"
    )
    if not args.no_docs:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
