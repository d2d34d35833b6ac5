"""What the cluster tests talk to: the balancer over HTTP, the servers over SQL, the launcher's faults."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.support.paths import ROOT

# No request may hang: anything slower than this fails the test.
REQUEST_TIMEOUT = 30.0


@dataclass
class Cluster:
    env: dict[str, str]
    launcher: Callable[..., None]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.env['CLUSTER_PORT']}"

    @property
    def primary_port(self) -> int:
        return int(self.env["CLUSTER_PG_PORT"])

    def pooled_env(self) -> dict[str, str]:
        """`manage.py` through PgBouncer, as the README's block runs it against the cluster."""
        return self.env | {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.primary_port + 2}/postgres",
            "DATABASE_POOLER": "transaction",
            "BASE_URL": self.base_url,
        }

    def token(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", "issue_token", *args],
            cwd=ROOT,
            env=self.pooled_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    def call(self, method: str, token: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(
            f"{self.base_url}/api/compute/{method}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=REQUEST_TIMEOUT,
        )

    def healthz(self) -> dict[str, Any]:
        answer: dict[str, Any] = requests.get(f"{self.base_url}/healthz", timeout=REQUEST_TIMEOUT).json()
        return answer

    def state(self) -> dict[str, Any]:
        """What the launcher keeps of the cluster (`state.json`): pids and ports."""
        state: dict[str, Any] = json.loads((Path(self.env["CLUSTER_DIR"]) / "state.json").read_text())
        return state

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view: `patronictl list` as JSON (name, role, state, lag)."""
        result = subprocess.run(
            [sys.executable, "-m", "config.cluster", "status", "--json"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        members: list[dict[str, Any]] = json.loads(result.stdout)
        return members

    def sql(self, query: str, *, replica: bool = False, port: int | None = None) -> list[tuple[Any, ...]]:
        """On the leader (HAProxy's leader frontend), a standby (`replica`), or the server on `port`."""
        port = port or self.primary_port + (1 if replica else 0)
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            cursor = conn.execute(query)
            return cursor.fetchall() if cursor.description else []
