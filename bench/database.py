"""The benchmark's own database: `bench_capacity` on the same server as the app's.

The server is `DATABASE_URL`'s when it is set, else the embedded PostgreSQL.
The benchmark never touches the dev or test databases: it drops and recreates
`bench_capacity` before each fleet size, and points Django (and the gunicorn
server it starts) at it through `DATABASE_URL`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import psycopg

BASE_DIR = Path(__file__).resolve().parent.parent
BENCH_DB = "bench_capacity"


@dataclass(frozen=True)
class Server:
    """Where the PostgreSQL server listens (a unix socket directory or a host)."""

    host: str
    port: str
    user: str
    password: str

    def url(self, dbname: str) -> str:
        """A `DATABASE_URL` for `dbname` that Django and psycopg both accept."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        if self.host.startswith("/"):
            query = urlencode({"host": self.host, **({"port": self.port} if self.port else {})})
            return f"postgresql://{auth}@/{dbname}?{query}"
        port = f":{self.port}" if self.port else ""
        return f"postgresql://{auth}@{self.host}{port}/{dbname}"

    def conninfo(self, dbname: str) -> str:
        parts = {"dbname": dbname, "user": self.user, "host": self.host}
        if self.port:
            parts["port"] = self.port
        if self.password:
            parts["password"] = self.password
        return " ".join(f"{k}='{v}'" for k, v in parts.items())


def server_find() -> Server:
    """`DATABASE_URL`'s server, or the embedded one (started if it is not running)."""
    url = os.environ.get("DATABASE_URL", "")
    if url:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))  # decoded: a socket directory comes as host=%2F...
        host = query.get("host") or parts.hostname or ""
        port = query.get("port") or (str(parts.port) if parts.port else "")
        return Server(host=host, port=port, user=parts.username or "postgres", password=parts.password or "")
    from config.database import embedded_database

    config = embedded_database(BASE_DIR)
    return Server(host=config["HOST"], port=config["PORT"], user=config["USER"], password=config["PASSWORD"])


def _check_name(dbname: str) -> None:
    if dbname in ("postgres", "template0", "template1") or not dbname.startswith("bench_"):
        raise ValueError(f"refusing to drop {dbname!r}: only bench_* databases")


def database_recreate(*, server: Server, dbname: str = BENCH_DB) -> None:
    """Drop (ending its sessions) and create the benchmark database, empty."""
    _check_name(dbname)
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')


def database_drop(*, server: Server, dbname: str = BENCH_DB) -> None:
    """Drop the benchmark database (a million bookings take about 1.5 GB of the server's disk)."""
    _check_name(dbname)
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
