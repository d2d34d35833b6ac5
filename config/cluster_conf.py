"""What the cluster's programs are told: the environments of the API replicas and the worker, and the
configuration files of the primary, PgBouncer and HAProxy.

No business logic: the app is configured through the environment the settings
already read (`DATABASE_URL`, `DATABASE_POOLER`, `DATABASE_REPLICA_URL`,
`DATABASE_DIRECT_URL`).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from config.cluster_state import DB_NAME, ROOT, STATE_DIR, Ports


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


def postgres_conf(ports: Ports) -> str:
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


def pgbouncer_conf(ports: Ports) -> str:
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


def haproxy_conf(ports: Ports, apis: int) -> str:
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
