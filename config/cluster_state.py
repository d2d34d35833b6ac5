"""Where the cluster of `make cluster` lives, and what its launcher started (`config/cluster.py`).

Everything is in `.cluster/` (`CLUSTER_DIR`), on one block of ten ports of its
own; `state.json` keeps the pids and ports `up` started, so that `stop` and
the fault commands find them again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("CLUSTER_DIR", ROOT / ".cluster"))
DB_NAME = "postgres"
# Patroni's scope (the cluster's name in etcd) and pgBackRest's stanza.
SCOPE = "capacity"
MEMBERS = ("pg1", "pg2")


@dataclass
class Ports:
    """One block of ports, far from PostgreSQL's 5432 and `make run`'s 8000.

    Below Linux's ephemeral range (32768-60999): a client connecting to a port
    in that range that nothing listens on yet (a member still starting) can be
    given that very port as its own, connect to itself, and hold the port the
    member is about to bind.

    `primary` and `replica` are HAProxy's two database frontends (the leader by
    Patroni's `/primary` check, a streaming standby by `/replica`): what the
    app, the worker and the tests connect to. The members themselves, their
    Patroni REST APIs and etcd follow, then the server a restore starts.
    """

    balancer: int = int(os.environ.get("CLUSTER_PORT", "8100"))
    primary: int = int(os.environ.get("CLUSTER_PG_PORT", "25431"))

    @property
    def replica(self) -> int:
        return self.primary + 1

    @property
    def pgbouncer(self) -> int:
        return self.primary + 2

    def member(self, index: int) -> int:
        """PostgreSQL of member `index` (0-based)."""
        return self.primary + 3 + index

    def rest(self, index: int) -> int:
        """Patroni's REST API of member `index` (0-based): HAProxy's checks, patronictl."""
        return self.primary + 5 + index

    @property
    def etcd(self) -> int:
        return self.primary + 7

    @property
    def etcd_peer(self) -> int:
        return self.primary + 8

    @property
    def restored(self) -> int:
        """The PostgreSQL that `restore` starts on the restored data directory."""
        return self.primary + 9

    @property
    def restored_api(self) -> int:
        """The API server that `restore` starts on the restored database."""
        return self.balancer + 9

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
    # The port `restore` started the restored server on (`Ports.restored` unless it was taken).
    restored_port: int = 0

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
