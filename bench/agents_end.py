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
import contextlib
import datetime
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from bench.agents import Uvicorn
from bench.database import BASE_DIR, database_drop, database_recreate, server_find
from bench.load import Client, percentile
from bench.server import Gunicorn
from better_compute_agent.cgroups import cgroup2_mount
from core.progress import progress_bar

END_DB = "bench_agents_end"
END_POOL = "agents-end"
SNAPSHOT = BASE_DIR / "better_compute_agent" / "snapshots" / "h100-8gpu-sriov.json"
GPUS = 8
RESERVATIONS = 50
RESERVATIONS_ENV = "BENCH_AGENTS_END_N"
TARGET_P99_MS = 1000.0
# How long the bench waits for each step before it calls the run failed (none is timed against these).
JOIN_S, HELD_S, STARTED_S, GONE_S, REMOVED_S = 30.0, 10.0, 10.0, 30.0, 10.0
LOOK_S = 0.002
OUT = BASE_DIR / "docs" / "benchmarks" / "agents_end.json"
T = TypeVar("T")
console = Console(stderr=True, width=None if sys.stderr.isatty() else 130)


class BenchError(Exception):
    """A step did not happen in time; the message says which, with the agent's last lines."""


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


@dataclass
class Root:
    """Where the reservations' cgroups go: a fresh kernel cgroup, or a stand-in directory."""

    path: Path
    real: bool
    why: str

    def remove(self) -> None:
        """Kill what is left in the reservations' cgroups and remove them, then the root itself."""
        if not self.path.exists():
            return
        if not self.real:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for child in sorted((p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _cgroup_empty(child)
            with contextlib.suppress(OSError):
                child.rmdir()
        _cgroup_empty(self.path)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _cgroup_empty(path: Path) -> None:
    """SIGKILL everything in a kernel cgroup and wait (briefly) for the kernel to reap it."""
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if not (path / "cgroup.procs").read_text().split():
                return
        except OSError:
            return
        time.sleep(0.01)


def _root_make(scratch: Path) -> Root:
    """A fresh cgroup under the bench's own in the v2 hierarchy when root may make one, else a stand-in."""
    mount = cgroup2_mount()
    if mount is None:
        why = "no cgroup2 filesystem is mounted"
    elif os.geteuid() != 0:
        why = "not root"
    else:
        own = ""
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    own = line[3:].strip()
        path = mount / own.lstrip("/") / f"bench-agents-end-{os.getpid()}"
        try:
            path.mkdir()
            return Root(path=path, real=True, why=f"the kernel's cgroup v2 ({mount})")
        except OSError as exc:
            why = f"cannot make a cgroup in {path.parent}: {exc.strerror}"
    path = scratch / "cgroup"
    path.mkdir()
    (path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (path / "cgroup.subtree_control").write_text("")
    (path / "cgroup.procs").write_text("")
    return Root(
        path=path, real=False, why=f"a stand-in directory ({why}): the kill is the agent's, one by one"
    )


# --- the agent ----------------------------------------------------------------------------------


class AgentDaemon:
    """One `better-compute-agent … run` for the bench's host, and the argv its `exec` takes."""

    def __init__(self, *, url: str, token: str, pool: str, directory: Path, cgroup_root: Path) -> None:
        self.directory, self.cgroup_root = directory, cgroup_root
        self.log_path = directory / "agent.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE", "DATABASE_URL"))}
        self.env = base | {
            "BETTER_COMPUTE_URL": url,
            "BETTER_COMPUTE_TOKEN": token,
            "BETTER_COMPUTE_POOL": pool,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self, *command: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "better_compute_agent",
            "--snapshot",
            str(SNAPSHOT),
            "--state-dir",
            str(self.directory / "state"),
            "--cdi-dir",
            str(self.directory / "cdi"),
            "--cgroup-root",
            str(self.cgroup_root),
            "--kill-grace",
            "0",
            *command,
        ]

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.argv("run"), cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no agent log)"

    def alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise BenchError(f"the agent exited\n{self.tail()}")


def _wait(probe: Callable[[], T], *, seconds: float, what: str, agent: AgentDaemon) -> T:
    """The first truthy value of `probe` within `seconds` (the agent still running), else BenchError."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        agent.alive()
        if time.monotonic() >= deadline:
            raise BenchError(f"not within {seconds:.0f} s: {what}\n{agent.tail()}")
        time.sleep(LOOK_S)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _members(path: Path) -> list[int]:
    try:
        return [int(word) for word in (path / "cgroup.procs").read_text().split() if word.isdigit()]
    except OSError:
        return []


# --- one booking --------------------------------------------------------------------------------


class Workload:
    """`sleep 600` inside the reservation's cgroup, and when it exited (its pidfd turned readable)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.exited: float | None = None
        self._fd = os.pidfd_open(process.pid)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        select.select([self._fd], [], [])
        self.exited = time.monotonic()

    def wait(self, seconds: float) -> float | None:
        """When it exited, within `seconds`; then reaped, so no zombie is left."""
        self._watcher.join(seconds)
        if self.exited is not None:
            self.process.wait()
            os.close(self._fd)
        return self.exited

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _workload(*, agent: AgentDaemon, root: Root, reservation_id: str) -> Workload:
    """The workload started in the reservation's cgroup, once it is `sleep` and a member there."""
    cgroup = root.path / reservation_id
    if os.geteuid() == 0:
        argv = agent.argv("exec", reservation_id, "--", "sleep", "600")
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            argv, cwd=BASE_DIR, env=agent.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    else:
        # `exec` needs root; on a stand-in its whole work is the line it appends to cgroup.procs.
        process = subprocess.Popen(["sleep", "600"], stderr=subprocess.PIPE)  # noqa: S607
        with (cgroup / "cgroup.procs").open("a") as handle:
            handle.write(f"{process.pid}\n")
    workload = Workload(process)

    def started() -> bool:
        if process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise BenchError(f"exec {reservation_id} exited {process.returncode}: {err.strip()}")
        return _comm(process.pid) == "sleep" and process.pid in _members(cgroup)

    try:
        _wait(started, seconds=STARTED_S, what=f"sleep running in {cgroup}", agent=agent)
    except BaseException:
        workload.kill()
        raise
    return workload


def _kill_all(workloads: list[Workload]) -> None:
    for workload in workloads:
        workload.kill()


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
