"""A thousand node agents: what their heartbeats and long polls cost, and how fast a booking reaches one.

`python -m bench.agents` (`--agents N`, `--seconds S`): the demo fleet in its
own database plus one exclusive pool for the agents, the production web server
(gunicorn, 2 workers x 24 threads) and the Procfile's `agents` process (uvicorn,
the long poll), and N simulated agents in one asyncio process
(`bench.agents_sim`): each registers a host of its own built from the shipped
H100 snapshot, reports, then keeps a long poll open, as the agent does; an
answered poll stamps the node, so it heartbeats only when no poll was answered
for 30 s. Measured: a tenant's `capacity/summary` before the loops start and
while the polls wait (target: p50 within 1.2x); the heartbeats' cost, the
stamps per second times the server CPU of one stamp (target: under 10 % of one
core), and the servers' CPU over a steady window; 100 one-GPU creates in the agents' pool, from each
create's answer to its agent's ack being answered (target: p99 <= 1 s, every
one delivered); and the database backends the servers hold while the polls
wait (the waits hold none: only the poll process's thread pool and its two
LISTEN connections, the bell's and the auth cache's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from bench.agents_sim import HEARTBEAT_SECONDS, Simulator
from bench.database import BASE_DIR, Server, database_drop, database_recreate, server_find
from bench.load import Client, latency_measure, percentile
from bench.server import READY_TIMEOUT_S, Gunicorn, free_port

AGENTS_DB = "bench_agents"
AGENTS_POOL = "agents"
SUMMARY_CALLS = 200
CREATES = 100
CREATE_SPACING_S = 0.1
DELIVERY_TIMEOUT_S = 30.0
SETTLE_S = 3.0
SUMMARY_RATIO = 1.2
HEARTBEAT_CPU_PCT = 10.0
DELIVERY_P99_MS = 1000.0
# Backends are told apart by the application name each server's connections carry (libpq's PGAPPNAME).
WEB_APP, POLL_APP = "bench-agents-web", "bench-agents-poll"
OUT = BASE_DIR / "docs" / "benchmarks" / "agents.json"
# The table reads best on one line a row; a log file gets it as wide as a terminal would.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 130)


def _setup(conninfo_url: str) -> dict[str, Any]:
    """Migrate, load the demo fleet plus the agents' empty pool (acme's), and issue the tokens."""
    os.environ["DATABASE_URL"] = conninfo_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-agents")
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
    data["pools"].append({"name": AGENTS_POOL, "owner": "acme", "gpuModel": "H100", "sharing": "exclusive"})
    fleet_load(data=data)
    rollup_rebuild_all()
    pool = Pool.objects.get(owner_id="acme", name=AGENTS_POOL)
    _, agent = token_issue(tenant_id=None, role="node-agent", scope_pool_id=pool.pk, name="bench agents")
    return {
        "pool": pool.pk,
        "agent": agent,
        "owner": token_issue(tenant_id="acme", role="member", name="bench agents owner")[1],
        "tenant": token_issue(tenant_id="beta", role="member", name="bench agents tenant")[1],
    }


class Uvicorn:
    """The Procfile's `agents` process on a free loopback port, its output in `log_path`."""

    def __init__(self, *, database_url: str, log_path: Path) -> None:
        self.database_url, self.log_path = database_url, log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "AGENTS_PROCESS": "1",
            "DATABASE_URL": self.database_url,
            "DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(32),
            "ALLOWED_HOSTS": "127.0.0.1",
            "PGAPPNAME": POLL_APP,
        }
        uvicorn = str(Path(sys.executable).with_name("uvicorn"))
        args = [uvicorn, "config.asgi:application", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--no-access-log", "--log-level", "warning", "--timeout-graceful-shutdown", "5"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=BASE_DIR, env=env, stdout=log, stderr=log)  # noqa: S603
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.health() is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start; see {self.log_path}")
            time.sleep(0.2)

    def health(self) -> dict[str, Any] | None:
        """`/healthz`: whether its LISTEN connection is up, and how many polls wait."""
        import http.client

        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", "/healthz")
            body = conn.getresponse().read()
            conn.close()
            answer: dict[str, Any] = json.loads(body)
            return answer
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (gunicorn's master and workers)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu(processes: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds of each process still running (from /proc/<pid>/stat)."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before[pid] for pid in before if pid in after)


# The LISTEN connections a server process holds whatever its load: the long polls' bell
# (`reservations.delivery.bell`) and the auth cache's (`core.auth_cache`).
PROCESS_LISTENERS = 2


def _backends(server: Server) -> dict[str, Any]:
    """The servers' backends on the bench database, by server (application name); how many LISTEN."""
    import psycopg

    with psycopg.connect(server.conninfo(AGENTS_DB)) as conn:
        rows = conn.execute(
            "SELECT pid, application_name, query FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [AGENTS_DB],
        ).fetchall()
    web = [pid for pid, app, _ in rows if app == WEB_APP]
    poll = [pid for pid, app, _ in rows if app == POLL_APP]
    listen = sum(1 for _, app, query in rows if app == POLL_APP and query.upper().startswith("LISTEN"))
    others = len(rows) - len(web) - len(poll)  # the bench's own connection, and any other client's
    return {
        "total": len(web) + len(poll),
        "web": len(web),
        "agents": len(poll),
        "listen": listen,
        "others": others,
        "pids": web + poll,
    }


def _summary(port: int, token: str) -> dict[str, Any]:
    client = Client(port=port, token=token)
    body = {"tenantId": "beta"}
    measured = latency_measure(client=client, method="capacity/summary", body=lambda _: body, n=SUMMARY_CALLS)
    client.close()
    return measured.as_dict()


def _deliveries(*, port: int, token: str, pool_id: str, sim: Simulator) -> dict[str, Any]:
    """`CREATES` one-GPU creates, `CREATE_SPACING_S` apart; each answer to its agent's ack answered."""
    client = Client(port=port, token=token)
    answered: dict[str, float] = {}
    statuses: dict[int, int] = {}
    due = time.monotonic()
    for index in range(CREATES):
        time.sleep(max(0.0, due - time.monotonic()))
        body = {
            "tenantId": "acme",
            "poolId": pool_id,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h",
            "idempotencyKey": f"agents-{index}",
        }
        status, answer = client.call("reservations/create", body)
        at = time.monotonic()
        statuses[status] = statuses.get(status, 0) + 1
        if status == 201:
            answered[answer["id"]] = at
        due += CREATE_SPACING_S
    client.close()
    sim.wait_acks(list(answered), DELIVERY_TIMEOUT_S)
    with sim.changed:
        ms = [(sim.acks[rid] - sent) * 1000 for rid, sent in answered.items() if rid in sim.acks]
    p99 = percentile(ms, 99) if ms else None
    return {
        "creates": CREATES,
        "create_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "created": len(answered),
        "delivered": len(ms),
        "p50_ms": round(statistics.median(ms), 2) if ms else None,
        "p99_ms": round(p99, 2) if p99 is not None else None,
        "max_ms": round(max(ms), 2) if ms else None,
        "target_p99_ms": DELIVERY_P99_MS,
        "met": bool(ms) and len(ms) == CREATES and p99 is not None and p99 <= DELIVERY_P99_MS,
    }


def _steady(
    *, gunicorn: Gunicorn, uvicorn: Uvicorn, sim: Simulator, server: Server, seconds: float
) -> dict[str, Any]:
    """The servers' CPU (and their backends') over `seconds` of heartbeats and waiting polls."""
    assert gunicorn.process is not None and uvicorn.process is not None and sim.process is not None
    waiting = (uvicorn.health() or {}).get("waiting", 0)
    backends = _backends(server)
    web_ps, poll_ps = _tree(gunicorn.process.pid), _tree(uvicorn.process.pid)
    sim_ps, db_ps = _tree(sim.process.pid), [p for pid in backends["pids"] for p in _tree(pid)]
    before = [_cpu(ps) for ps in (web_ps, poll_ps, sim_ps, db_ps)]
    started = time.monotonic()
    time.sleep(seconds)
    ended = time.monotonic()
    after = [_cpu(ps) for ps in (web_ps, poll_ps, sim_ps, db_ps)]
    web, poll, simulator, db = (
        _used(b, a) * 100 / (ended - started) for b, a in zip(before, after, strict=True)
    )
    later = _backends(server)
    held = max(backends, later, key=lambda b: b["total"])
    # The poll process's database work runs in asyncio's default thread pool.
    pool_threads = min(32, (os.cpu_count() or 1) + 4)
    return {
        "window": (started, ended),
        "cpu": {
            "seconds": round(ended - started, 1),
            "web_pct": round(web, 2),
            "agents_pct": round(poll, 2),
            "total_pct": round(web + poll, 2),
            "database_pct_lower_bound": round(db, 2),
            "simulator_pct": round(simulator, 2),
        },
        "backends": {
            "polls_waiting": waiting,
            "total": held["total"],
            "web": held["web"],
            "agents": held["agents"],
            "agents_listen": held["listen"],
            "agents_thread_pool": pool_threads,
            "met": held["agents"] <= pool_threads + PROCESS_LISTENERS and held["listen"] <= PROCESS_LISTENERS,
        },
    }


def _heartbeats(done: dict[str, Any], window: tuple[float, float]) -> dict[str, Any]:
    inside = [(ms, status) for at, ms, status in done["heartbeats"] if window[0] <= at <= window[1]]
    ms = [m for m, _ in inside]
    statuses: dict[str, int] = {}
    for _, status in inside:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2) if ms else None,
        "p99_ms": round(percentile(ms, 99), 2) if ms else None,
        "statuses": statuses,
    }


def _stamps(*, polls: int, seconds: float, pool_id: str) -> dict[str, Any]:
    """Heartbeats ride the long polls: each answered poll stamps its node (one UPDATE). Their cost is
    the stamps per second the agents made, times what one stamp costs the server process."""
    from inventory.models import Node

    node = Node.objects.filter(pool_id=pool_id).values_list("pk", flat=True).first()
    cost = _stamp_cost(str(node)) if node else {"cpu_ms": 0.0, "wall_ms": 0.0}
    per_s = polls / seconds if seconds > 0 else 0.0
    pct = per_s * cost["cpu_ms"] / 10  # ms per s → % of a core
    return {
        "per_s": round(per_s, 1),
        "cpu_ms": cost["cpu_ms"],
        "wall_ms": cost["wall_ms"],
        "pct_of_core": round(pct, 2),
        "target_pct": HEARTBEAT_CPU_PCT,
        "met": pct < HEARTBEAT_CPU_PCT,
    }


def _measure(*, server: Server, setup: dict[str, Any], agents: int, seconds: float) -> dict[str, Any]:
    """The servers and the agents up; every measurement, in order; the servers stopped, whatever happens."""
    url = server.url(AGENTS_DB)
    logs = Path(tempfile.gettempdir())
    result: dict[str, Any] = {}
    # Each is stopped on the way out (the simulated agents first) even when its start failed halfway.
    with ExitStack() as stack:
        uvicorn = Uvicorn(database_url=url, log_path=logs / "bench-agents-uvicorn.log")
        stack.callback(uvicorn.stop)
        uvicorn.start()
        gunicorn = Gunicorn(
            database_url=url, log_path=logs / "bench-agents-gunicorn.log", workers=2, threads=24
        )
        stack.callback(gunicorn.stop)
        # The web process tells the agents where to long-poll; its connections carry their own name.
        os.environ["AGENT_ASSIGNMENTS_URL"] = f"http://127.0.0.1:{uvicorn.port}"
        os.environ["PGAPPNAME"] = WEB_APP
        try:
            gunicorn.start()
        finally:
            del os.environ["AGENT_ASSIGNMENTS_URL"], os.environ["PGAPPNAME"]
        sim = Simulator(
            url=f"http://127.0.0.1:{gunicorn.port}",
            token=setup["agent"],
            pool_id=setup["pool"],
            agents=agents,
        )
        stack.callback(sim.stop)
        sim.start()
        ready = sim.wait("ready", timeout=30 * 60)
        result["onboard"] = {"agents": ready["agents"], "seconds": ready["seconds"]}
        result["summary_quiet"] = _summary(gunicorn.port, setup["tenant"])
        sim.send("go")
        sim.wait("started", timeout=60)
        going = time.monotonic()
        time.sleep(HEARTBEAT_SECONDS + SETTLE_S)
        steady = _steady(gunicorn=gunicorn, uvicorn=uvicorn, sim=sim, server=server, seconds=seconds)
        result.update(cpu=steady["cpu"], backends=steady["backends"])
        result["summary_agents"] = _summary(gunicorn.port, setup["tenant"])
        result["deliveries"] = _deliveries(
            port=gunicorn.port, token=setup["owner"], pool_id=setup["pool"], sim=sim
        )
        sim.send("stop")
        stopped = time.monotonic()
        done = sim.wait("done", timeout=60)
        result["heartbeats"] = _heartbeats(done, steady["window"])
        result["stamps"] = _stamps(polls=done["polls"], seconds=stopped - going, pool_id=setup["pool"])
        result["simulator"] = {k: done[k] for k in ("polls", "acks", "reportsAgain", "errors")}
    return result


def _stamp_cost(node_id: str, *, count: int = 2000) -> dict[str, float]:
    """What one heartbeat stamp (the UPDATE an answered poll makes) costs the server process."""
    from inventory.services.agents import node_heartbeat

    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        node_heartbeat(node_id=node_id)
    return {
        "cpu_ms": round((time.process_time() - cpu) * 1000 / count, 4),
        "wall_ms": round((time.perf_counter() - wall) * 1000 / count, 4),
    }


def run(*, agents: int, seconds: float, keep_db: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    server = server_find()
    database_recreate(server=server, dbname=AGENTS_DB)
    try:
        setup = _setup(server.url(AGENTS_DB))
        measured = _measure(server=server, setup=setup, agents=agents, seconds=seconds)
    finally:
        from django.db import connections

        connections.close_all()
        if not keep_db:
            database_drop(server=server, dbname=AGENTS_DB)
    quiet, loaded = measured.pop("summary_quiet"), measured.pop("summary_agents")
    ratio = loaded["p50_ms"] / quiet["p50_ms"]
    return {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "agents": agents,
        "steady_s": seconds,
        "summary": {
            "quiet": quiet,
            "agents": loaded,
            "ratio_p50": round(ratio, 2),
            "target_ratio": SUMMARY_RATIO,
            "met": ratio <= SUMMARY_RATIO,
        },
        **measured,
        "total_s": round(time.monotonic() - started, 1),
    }


def _verdict(met: bool) -> str:
    return "[green]met[/]" if met else "[red]not met[/]"


def table(result: dict[str, Any]) -> Table:
    """The run's numbers, one measurement a row, with its target and verdict."""
    n = result["agents"]
    out = Table(title=f"{n:,} node agents ({result['machine']['cpus']} CPUs, {result['total_s']:.0f} s)")
    for column in ("measurement", "measured", "target", ""):
        out.add_column(column)
    s, hb, cpu, d, b = (result[k] for k in ("summary", "heartbeats", "cpu", "deliveries", "backends"))
    st = result["stamps"]
    out.add_row("register + report", f"{result['onboard']['seconds']:.1f} s", "", "")
    out.add_row(
        "capacity/summary p50 / p99, quiet",
        f"{s['quiet']['p50_ms']:.2f} / {s['quiet']['p99_ms']:.2f} ms",
        "",
        "",
    )
    out.add_row(
        f"capacity/summary p50 / p99, {n:,} polls waiting",
        f"{s['agents']['p50_ms']:.2f} / {s['agents']['p99_ms']:.2f} ms ({s['ratio_p50']}x)",
        f"p50 <= {s['target_ratio']}x quiet",
        _verdict(s["met"]),
    )
    out.add_row(
        f"heartbeats: {st['per_s']}/s, carried by the answered polls",
        f"{st['cpu_ms']} ms CPU each ({st['wall_ms']} ms wall): {st['pct_of_core']:.2f} % of a core",
        f"< {st['target_pct']:.0f} %",
        _verdict(st["met"]),
    )
    out.add_row(
        f"separate heartbeats sent (p50 / p99: {hb['p50_ms']} / {hb['p99_ms']} ms)", f"{hb['n']:,}", "", ""
    )
    out.add_row(f"CPU over {cpu['seconds']:.0f} s: web", f"{cpu['web_pct']:.1f} % of a core", "", "")
    out.add_row("CPU: agents process (long polls)", f"{cpu['agents_pct']:.1f} %", "", "")
    out.add_row("CPU: servers' total", f"{cpu['total_pct']:.1f} %", "", "")
    out.add_row("CPU: their database backends (at least)", f"{cpu['database_pct_lower_bound']:.1f} %", "", "")
    out.add_row("CPU: the simulated agents (client)", f"{cpu['simulator_pct']:.1f} %", "", "")
    out.add_row(
        f"delivery p50 / p99 ({d['delivered']}/{d['creates']} delivered)",
        f"{d['p50_ms']} / {d['p99_ms']} ms",
        f"p99 <= {d['target_p99_ms']:.0f} ms, all",
        _verdict(d["met"]),
    )
    out.add_row(
        f"backends while {b['polls_waiting']:,} polls wait",
        f"{b['total']} (web {b['web']}, agents {b['agents']}: {b['agents_listen']} LISTEN)",
        f"agents <= {b['agents_thread_pool']} threads + {PROCESS_LISTENERS} LISTEN",
        _verdict(b["met"]),
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__)
    parser.add_argument("--agents", type=int, default=1000, help="simulated node agents (default 1000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the steady window (default 60)")
    parser.add_argument("--keep-db", action="store_true", help=f"keep {AGENTS_DB} after the run")
    parser.add_argument("--no-docs", action="store_true", help=f"print only; do not write {OUT}")
    args = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C: the servers and the agents stop, the database is dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(agents=args.agents, seconds=args.seconds, keep_db=args.keep_db)
    console.print(table(result))
    if not args.no_docs:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
