"""The service as it runs on several machines, brought up on this one: `make cluster`.

Real programs only, from Debian's packages: two PostgreSQL 15 members under
Patroni (one etcd holds the leader lock; synchronous replication, so a commit
is on both before it is answered), pgBackRest archiving their WAL, HAProxy in
front of the members (the leader by Patroni's `/primary` check, a standby by
`/replica`) and of the API replicas, PgBouncer in transaction mode in front of
HAProxy's leader frontend, the API replicas (gunicorn, as the Procfile's
`web`) and the worker (`manage.py worker`) on a direct connection through
HAProxy to whichever member leads, because its advisory locks and LISTEN need
a session (docs/scaling.md, docs/operations.md).

Everything lives in `.cluster/` (git-ignored) on its own ports, so it never
touches `.pgdata/` or a PostgreSQL on 5432. `up` starts from scratch, prints
the members, who leads, the balancer's address and the admin login and stops
everything on Ctrl-C (`--detach` returns instead, for tests); `stop` stops
whatever is left and removes `.cluster/`; `status` prints `patronictl list`;
`backup` takes a full backup and `restore --target-time T` recovers one into
a new data directory and starts an API server on it. The fault commands
(`kill-api N`, `start-api N`, `stop-replica`, `start-replica`, `kill-leader`,
`start-members`, `switchover`, `pause`/`resume`: Patroni's maintenance mode)
are what the cluster tests use.

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
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from config import cluster_backup, cluster_patroni
from config.cluster_conf import app_env, client_env, haproxy_conf, patroni_timings, pgbouncer_conf
from config.cluster_programs import (
    kill_group,
    manage,
    own,
    program,
    require_programs,
    spawn,
    stop_pid,
    wait_http,
)
from config.cluster_state import MEMBERS, ROOT, STATE_DIR, Ports, State


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
        # LOG_FORMAT=json makes gunicorn's own lines JSON too, as the Procfile's web does.
        "--logger-class",
        "core.logs.GunicornLogger",
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
    """Stop the member that does not lead (Patroni stops its PostgreSQL); the leader goes on alone."""
    current = cluster_patroni.leader(state.ports)
    for index in range(len(MEMBERS)):
        if index != current:
            cluster_patroni.stop_member(state, index)


def start_members(state: State) -> None:
    """Start every member whose Patroni is not running, and wait until it streams from the leader again."""
    for index in range(len(MEMBERS)):
        if not cluster_patroni.running(state, index):
            cluster_patroni.start_member(state, index)
    cluster_patroni.wait_until(
        lambda: cluster_patroni.streaming(state.ports, synchronous=True),
        what="streaming from the leader again",
        timeout=180,
    )


def kill_leader(state: State) -> None:
    """The fault that matters most: SIGKILL to the leader's Patroni and PostgreSQL. Patroni fails over."""
    current = cluster_patroni.leader(state.ports)
    if current is None:
        raise SystemExit("no member leads: nothing to kill")
    cluster_patroni.kill_member(state, current)
    print(f"killed {MEMBERS[current]}", flush=True)


def up(*, apis: int, detach: bool) -> State:
    """Start everything from scratch and wait until the balancer answers."""
    require_programs()
    stop(remove=True)
    ports = Ports()
    for sub in ("logs", "run"):
        (STATE_DIR / sub).mkdir(parents=True, exist_ok=True)
    state = State(apis=apis, balancer=ports.balancer, primary=ports.primary)
    state.save()
    (STATE_DIR / "haproxy.cfg").write_text(haproxy_conf(ports, apis))
    own(STATE_DIR)

    print("etcd, then HAProxy (the members' frontends)", flush=True)
    cluster_patroni.start_etcd(state)
    direct = app_env(ports, direct=True)
    state.pids["haproxy"] = spawn(
        "haproxy", [program("haproxy"), "-db", "-f", str(STATE_DIR / "haproxy.cfg")], env=direct
    )
    print(f"{MEMBERS[0]}: Patroni bootstraps the cluster", flush=True)
    cluster_patroni.start_member(state, 0)
    cluster_patroni.wait_until(lambda: cluster_patroni.leader(ports) == 0, what="leading", timeout=120)
    cluster_backup.stanza_create(state)
    print(f"{MEMBERS[1]}: Patroni clones the leader, then streams synchronously", flush=True)
    cluster_patroni.start_member(state, 1)
    cluster_patroni.wait_until(
        lambda: cluster_patroni.streaming(ports, synchronous=True), what="a synchronous standby", timeout=180
    )

    print("the leader: migrate, demo fleet, one worker pass", flush=True)
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
    timings = ", ".join(f"{k} {v}s" for k, v in patroni_timings().items())
    current = cluster_patroni.leader(ports)
    print(
        f"""
The cluster is up (logs in {_shown(STATE_DIR)}/logs/):
  balancer (HAProxy)     http://127.0.0.1:{ports.balancer}/   admin: http://127.0.0.1:{ports.balancer}/admin/
  admin login            user: admin  password: {state.admin_password}
  API replicas           {", ".join(str(ports.api(i)) for i in range(state.apis))} (gunicorn)
  PgBouncer (transaction) 127.0.0.1:{ports.pgbouncer}  ->  the leader, by HAProxy 127.0.0.1:{ports.primary}
  reads that may lag     a standby, by HAProxy 127.0.0.1:{ports.replica}
  worker                 direct to the leader, by HAProxy 127.0.0.1:{ports.primary}
  etcd                   127.0.0.1:{ports.etcd}   Patroni: {timings}, synchronous_mode on
  leader                 {MEMBERS[current] if current is not None else "none yet"}
PostgreSQL members (Patroni; `make cluster-status` shows patronictl list):
{cluster_patroni.describe(ports)}
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
    """Stop everything `up` started (programs, members, etcd); with `remove`, delete `.cluster/`."""
    state = State.load()
    if state is not None:
        cluster_backup.stop_restored(state)
        for name in ("haproxy", *[f"api{i + 1}" for i in range(state.apis)], "worker", "pgbouncer"):
            pid = state.pids.pop(name, None)
            if pid is not None:
                stop_pid(pid)
        for index in range(len(MEMBERS)):
            cluster_patroni.stop_member(state, index)
        pid = state.pids.pop("etcd", None)
        if pid is not None:
            stop_pid(pid)
        state.save()
    if remove and STATE_DIR.exists():
        shutil.rmtree(STATE_DIR)


COMMANDS = [
    "up",
    "stop",
    "status",
    "backup",
    "restore",
    "kill-api",
    "start-api",
    "stop-replica",
    "start-replica",
    "kill-leader",
    "start-members",
    "switchover",
    "pause",
    "resume",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m config.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("index", nargs="?", type=int, default=1, help="the API replica (1-based)")
    parser.add_argument(
        "--target-time",
        help="restore: recover up to this time, else to the end of the archive (e.g. 2026-01-31 12:00:00+00)",
    )
    parser.add_argument("--apis", type=int, default=int(os.environ.get("CLUSTER_APIS", "3")))
    parser.add_argument("--json", action="store_true", help="status: Patroni's /cluster members as JSON")
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
        _change(options.command, options.index, options.target_time, as_json=options.json)


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


def _change(command: str, index: int, target_time: str | None = None, *, as_json: bool = False) -> None:
    """One fault, repair or operation on the running cluster; `index` is the API replica's, 1-based."""
    state = State.load()
    if state is None:
        raise SystemExit("no cluster is running (make cluster)")
    if command == "kill-api":
        kill_api(state, index - 1)
    elif command == "start-api":
        start_api(state, index - 1)
    elif command == "stop-replica":
        stop_replica(state)
    elif command in ("start-replica", "start-members"):
        start_members(state)
    elif command == "kill-leader":
        kill_leader(state)
    elif command == "switchover":
        print(f"switched over to {cluster_patroni.switchover(state)}", flush=True)
    elif command in ("pause", "resume"):
        # Patroni's maintenance mode: it leaves the members alone (a paused WAL replay stays paused).
        print(cluster_patroni.patronictl(command, "--wait"), end="", flush=True)
    elif command == "status" and as_json:
        print(json.dumps(cluster_patroni.members(state.ports)), flush=True)
    elif command == "status":
        print(cluster_patroni.patronictl("list"), end="", flush=True)
    elif command == "backup":
        print(cluster_backup.backup(state), end="", flush=True)
    else:
        cluster_backup.restore(state, target_time)


if __name__ == "__main__":
    main()
