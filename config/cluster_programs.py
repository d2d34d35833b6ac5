"""Running the cluster's programs: etcd, Patroni, PostgreSQL, pgBackRest, PgBouncer, HAProxy, gunicorn
and manage.py.

Each long-running program is started in a process group of its own with its
output in `.cluster/logs/`, so a Ctrl-C meant for the launcher never reaches
it and a stop ends the whole group. PostgreSQL and PgBouncer refuse to run as
root: as root, the servers run as an unprivileged user.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from config.cluster_conf import PG_BIN_DIR
from config.cluster_state import ROOT, STATE_DIR

# PostgreSQL refuses to run as root, and so does PgBouncer: as root, the servers run as the
# same unprivileged user the embedded database of `make run` uses.
SERVER_USER = "embedded_postgres"
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin"


def pg_bin(name: str) -> str:
    """A program of Debian's PostgreSQL 15: the newest major its Patroni and pgBackRest support."""
    return str(PG_BIN_DIR / name)


def program(name: str) -> str:
    """Debian's programs; PgBouncer and HAProxy live in /usr/sbin, which a user's PATH may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise SystemExit(f"{name} is missing: apt-get install {' '.join(PACKAGES.values())}")
    return found


# The programs the cluster runs, and the Debian package of each.
PACKAGES = {
    "pgbouncer": "pgbouncer",
    "haproxy": "haproxy",
    "patroni": "patroni",
    "etcd": "etcd-server",
    "pgbackrest": "pgbackrest",
}


def require_programs() -> None:
    """Install the cluster's Debian packages when missing and we may (root with apt-get), as CI does."""
    missing = [package for name, package in PACKAGES.items() if not shutil.which(name, path=SBIN_PATH)]
    if not (PG_BIN_DIR / "postgres").exists():
        missing.append("postgresql-15")
    if not missing:
        return
    apt = shutil.which("apt-get")
    if os.geteuid() != 0 or apt is None:
        raise SystemExit(
            f"missing: {', '.join(missing)}; install them with: apt-get install {' '.join(missing)}"
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


def own(path: Path) -> None:
    user = _server_user()
    if user is not None:
        shutil.chown(path, user=user)
        for child in path.rglob("*"):
            shutil.chown(child, user=user)


def run(args: list[str], *, as_server: bool = False, env: dict[str, str] | None = None) -> str:
    user = _server_user() if as_server else None
    # In a session of its own: a Ctrl-C meant for the launcher must not reach a server that
    # pg_ctl leaves running (the launcher stops everything in order).
    result = subprocess.run(  # noqa: S603
        args, user=user, env=env, capture_output=True, text=True, check=False, start_new_session=True
    )
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _log(name: str) -> Any:
    return (STATE_DIR / "logs" / f"{name}.log").open("ab")


def spawn(name: str, args: list[str], *, env: dict[str, str], as_server: bool = False) -> int:
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


def pg_ctl(datadir: Path, action: str, port: int | None = None, options: str = "") -> None:
    """A PostgreSQL that Patroni does not run (the restored one): started or stopped by pg_ctl."""
    args = [pg_bin("pg_ctl"), "-D", str(datadir), "-w", "-t", "180"]
    if action == "start":
        args += ["-l", str(STATE_DIR / "logs" / f"{datadir.name}.log"), "-o", f"-p {port} {options}"]
    else:
        args += ["-m", "fast"]
    run([*args, action], as_server=True)


def wait_http(url: str, *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310
                return
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what} did not answer at {url}: {error}") from error
            time.sleep(0.3)


def kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    kill_group(pid, signal.SIGKILL)


def manage(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout
