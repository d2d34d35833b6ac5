"""What the cluster's programs are told: the environments of the API replicas and the worker, and the
configuration files of etcd, the Patroni members, pgBackRest, PgBouncer and HAProxy.

No business logic: the app is configured through the environment the settings
already read (`DATABASE_URL`, `DATABASE_POOLER`, `DATABASE_REPLICA_URL`,
`DATABASE_DIRECT_URL`).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from config.cluster_state import DB_NAME, MEMBERS, ROOT, SCOPE, STATE_DIR, Ports

# Debian's PostgreSQL 15: the newest major Debian's Patroni (3.0) and pgBackRest (2.45) support.
PG_BIN_DIR = Path(os.environ.get("CLUSTER_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _url(port: int) -> str:
    return f"postgres://postgres@127.0.0.1:{port}/{DB_NAME}"


def app_env(ports: Ports, *, direct: bool) -> dict[str, str]:
    """The environment of an API replica (through the pooler, with the replica) or of the worker (direct).

    "Direct" is HAProxy's leader frontend, never a member: whichever member
    Patroni made the leader is where the worker, the LISTEN connections and
    PgBouncer's server connections go, and they follow it after a failover.
    """
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
; After a failover the leader frontend answers again within seconds: retry a failed
; server login after 1 s, not the default 15 s, so the pool does not outlast the outage.
server_login_retry = 1
server_connect_timeout = 3
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
    members = "\n".join(
        f"    server {name} 127.0.0.1:{ports.member(i)} check port {ports.rest(i)}"
        for i, name in enumerate(MEMBERS)
    )
    # Round robin, no stickiness (section 1). A request whose connection to a replica
    # was refused (the replica is dead) is retried on another one: it never reached a
    # server, so that is safe for a create too; nothing else is retried here, since a
    # create that reached a server may have committed (clients retry with idempotencyKey).
    #
    # The database frontends: Patroni decides who leads, HAProxy only asks each member's
    # REST API (`/primary` answers 200 on the leader alone, `/replica` on a running
    # standby) every second. A member marked down has its sessions cut, so no connection
    # stays on a demoted or dead leader.
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

listen postgres-leader
    mode tcp
    bind 127.0.0.1:{ports.primary}
    timeout client 1h
    timeout server 1h
    timeout check 2s
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 1s fastinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{members}

listen postgres-replica
    mode tcp
    bind 127.0.0.1:{ports.replica}
    timeout client 1h
    timeout server 1h
    timeout check 2s
    balance roundrobin
    option httpchk GET /replica
    http-check expect status 200
    default-server inter 1s fastinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{members}
"""


def patroni_timings() -> dict[str, int]:
    """Patroni's failover timings: its defaults (ttl 30, loop_wait 10, retry_timeout 10) unless set.

    The cluster tests set tight ones (`CLUSTER_PATRONI_TTL`, `_LOOP_WAIT`,
    `_RETRY_TIMEOUT`); Patroni needs `loop_wait + 2 * retry_timeout <= ttl`.
    """
    return {
        "ttl": int(os.environ.get("CLUSTER_PATRONI_TTL", "30")),
        "loop_wait": int(os.environ.get("CLUSTER_PATRONI_LOOP_WAIT", "10")),
        "retry_timeout": int(os.environ.get("CLUSTER_PATRONI_RETRY_TIMEOUT", "10")),
    }


def member_dir(index: int) -> Path:
    return STATE_DIR / MEMBERS[index]


def pgbackrest_conf_path() -> Path:
    return STATE_DIR / "pgbackrest.conf"


def archive_command(index: int) -> str:
    """Every WAL segment a member completes goes to pgBackRest's repository (from whichever leads)."""
    return (
        f"pgbackrest --config={pgbackrest_conf_path()} --stanza={SCOPE} --pg1-path={member_dir(index)}"
        " archive-push %p"
    )


def patroni_conf(ports: Ports, index: int) -> dict[str, Any]:
    """Member `index`'s Patroni configuration (written as JSON, which Patroni reads as YAML)."""
    name = MEMBERS[index]
    trust = [
        "local all all trust",
        "host all all 127.0.0.1/32 trust",
        "host replication all 127.0.0.1/32 trust",
    ]
    parameters = {
        "wal_level": "replica",
        "hot_standby": "on",
        "hot_standby_feedback": "on",
        "max_connections": 100,
        "shared_buffers": "128MB",
        "max_wal_senders": 6,
        "max_replication_slots": 6,
        "wal_log_hints": "on",
        "wal_keep_size": "256MB",
        "archive_mode": "on",
        "archive_command": "/bin/true",
        "archive_timeout": 60,
        # A commit waits for the standby's flush: what a 201 promises is on two members.
        "synchronous_commit": "on",
    }
    return {
        "scope": SCOPE,
        "name": name,
        "restapi": {
            "listen": f"127.0.0.1:{ports.rest(index)}",
            "connect_address": f"127.0.0.1:{ports.rest(index)}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{ports.etcd}"]},
        "bootstrap": {
            "dcs": {
                **patroni_timings(),
                "maximum_lag_on_failover": 1048576,
                # The leader commits only when the synchronous standby has the WAL; only that
                # standby may be promoted, so nothing acknowledged is lost in a failover.
                "synchronous_mode": True,
                "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": parameters},
            },
            "initdb": [{"encoding": "UTF8"}, "data-checksums", {"auth": "trust"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{ports.member(index)}",
            "connect_address": f"127.0.0.1:{ports.member(index)}",
            "data_dir": str(member_dir(index)),
            "bin_dir": str(PG_BIN_DIR),
            "pgpass": str(STATE_DIR / "run" / f"pgpass-{name}"),
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
                "rewind": {"username": "postgres"},
            },
            # Local parameters win over the cluster-wide ones: each member archives from its own directory.
            "parameters": {
                "unix_socket_directories": str(STATE_DIR / "run"),
                "archive_command": archive_command(index),
            },
            "pg_hba": trust,
            # A member that comes back after a failover may hold WAL the new leader never had
            # (written, never acknowledged): pg_rewind takes it back, or a fresh copy is made.
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }


def patroni_conf_path(index: int) -> Path:
    return STATE_DIR / f"patroni-{MEMBERS[index]}.yml"


def write_patroni_conf(ports: Ports, index: int) -> Path:
    path = patroni_conf_path(index)
    path.write_text(json.dumps(patroni_conf(ports, index), indent=2))
    return path


def pgbackrest_conf() -> str:
    """pgBackRest's repository in `.cluster/backup/` (a deployment's is on other storage: `repo1-type`)."""
    return f"""[global]
repo1-path={STATE_DIR / "backup"}
repo1-retention-full=2
log-path={STATE_DIR / "logs"}
lock-path={STATE_DIR / "run"}
spool-path={STATE_DIR / "run"}
log-level-console=warn
log-level-file=info
start-fast=y
compress-type=lz4
archive-timeout=30

[{SCOPE}]
pg1-socket-path={STATE_DIR / "run"}
pg1-user=postgres
"""
