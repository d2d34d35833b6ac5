"""A real cluster for the tests marked `cluster`: `make soak-cluster` runs them (CI does, once).

It is the one `make cluster` starts (config/cluster.py), in a directory and on
ports of its own so that it never touches a cluster a developer is running.
Outside `make soak-cluster` (CLUSTER=1) these tests are deselected: the default
run stays on one database, and twice in CI would only repeat the same servers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster.client import Cluster
from tests.support.commands import run_python
from tests.support.paths import ROOT

CLUSTER_DIR = ROOT / ".cluster-test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: runs against a real cluster (make soak-cluster)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside `make soak-cluster`, the cluster tests are deselected (not run, and not left as skips)."""
    if os.environ.get("CLUSTER") == "1":
        return
    deselected = [item for item in items if "cluster" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "cluster" not in item.keywords]


def _launcher(*args: str, env: dict[str, str]) -> None:
    result = run_python("-m", "config.cluster", *args, env=env, timeout=300)
    assert result.returncode == 0, f"config.cluster {args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Up once for the session (about 25 s), stopped and removed at the end whatever happened."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    env |= {
        "CLUSTER_DIR": str(CLUSTER_DIR),
        "CLUSTER_PORT": "8200",
        "CLUSTER_PG_PORT": "25451",
        "SECRET_KEY": "cluster-test-secret-key",
        # Small bounds, so the tests see a lagging replica and the end of read-your-writes quickly.
        "DATABASE_REPLICA_MAX_LAG_SECONDS": "2",
        "DATABASE_REPLICA_CHECK_SECONDS": "0.5",
        # Tight Patroni timings (its defaults: 30, 10, 10), so a failover takes seconds, not half a
        # minute; loop_wait + 2 * retry_timeout stays within ttl, as Patroni needs.
        "CLUSTER_PATRONI_TTL": "10",
        "CLUSTER_PATRONI_LOOP_WAIT": "1",
        "CLUSTER_PATRONI_RETRY_TIMEOUT": "4",
    }
    cluster = Cluster(env=env, launcher=lambda *args: _launcher(*args, env=env))
    try:
        _launcher("up", "--detach", "--apis", "3", env=env)
        yield cluster
    finally:
        _launcher("stop", env=env)
