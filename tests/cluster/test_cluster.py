"""The cluster of `make cluster`, with real programs, and its faults.

In order: the README's walkthrough through the balancer; the reads that may
lag answered by the streaming replica, a client's own create seen at once even
when the replica has stopped replaying; an API replica killed while requests
keep succeeding; the replica stopped (reads fall back to the primary, and
`/healthz` says so) and started again.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

import pytest

from tests.cluster.client import Cluster
from tests.guarantees.test_readme import try_it_block
from tests.support.paths import ROOT

pytestmark = pytest.mark.cluster


def _pool(cluster: Cluster, token: str, tenant: str, name: str = "h100-east") -> str:
    answer = cluster.call("capacity/summary", token, {"tenantId": tenant})
    assert answer.status_code == 200, answer.text
    return next(p["poolId"] for p in answer.json()["pools"] if p["name"] == name)


def _gpu_row(cluster: Cluster, token: str, tenant: str, pool: str) -> dict[str, Any]:
    answer = cluster.call("capacity/byPool", token, {"tenantId": tenant, "poolId": pool})
    assert answer.status_code == 200, answer.text
    return next(row for row in answer.json()["rows"] if row["resource"] == "gpu")


def _capacity_readers_on_replica(cluster: Cluster) -> int:
    """Client backends on the replica whose last query was a capacity read (connections persist)."""
    rows = cluster.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
        "AND query ~ '(pool_capacity_rollup|device_bookings|inventory_pool)' AND pid <> pg_backend_pid()",
        replica=True,
    )
    return int(rows[0][0])


def _wait_for(predicate: Any, *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"still not {what} after {seconds}s"
        time.sleep(0.3)


def test_the_try_it_block_runs_against_the_balancer(cluster: Cluster) -> None:
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + try_it_block()],
        cwd=ROOT,
        env=cluster.pooled_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert '"error"' not in result.stdout
    assert '"state":"released"' in result.stdout.replace(" ", "")


def test_the_reads_that_may_lag_are_answered_by_the_replica(cluster: Cluster) -> None:
    # gamma never writes in these tests, so read-your-writes never sends it to the primary.
    token = cluster.token("--tenant", "gamma", "--role", "viewer", "--name", "dashboard")
    pool = _pool(cluster, token, "gamma", name="h100-lab")
    for _ in range(6):
        assert (
            cluster.call("capacity/byPool", token, {"tenantId": "gamma", "poolId": pool}).status_code == 200
        )
        assert (
            cluster.call("capacity/timeline", token, {"tenantId": "gamma", "poolId": pool}).status_code == 200
        )
        assert cluster.call("capacity/summary", token, {"tenantId": "gamma"}).status_code == 200
        now = int(time.time() * 1000)
        window = {"tenantId": "gamma", "from": now - 86_400_000, "to": now}
        usage = cluster.call("usage/hourly", token, window)
        assert usage.status_code == 200, usage.text
    assert _capacity_readers_on_replica(cluster) > 0
    replica = cluster.healthz()["replica"]
    assert replica["readsFrom"] == "replica", replica


def _one_gpu_for_an_hour(tenant_id: str, pool_id: str, key: str) -> dict[str, Any]:
    """A `reservations/create` body: one whole GPU for an hour."""
    return {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": "1h",
        "idempotencyKey": key,
    }


def test_a_client_reads_its_own_create_while_the_replica_stands_still(cluster: Cluster) -> None:
    token = cluster.token("--tenant", "beta", "--role", "member", "--name", "ryw")
    pool = _pool(cluster, token, "beta")
    before = _gpu_row(cluster, token, "beta", pool)
    # Patroni resumes a paused replay on its next loop unless the cluster is in its maintenance
    # mode: the way an operator does anything by hand to a member it runs.
    cluster.launcher("pause")
    cluster.sql("SELECT pg_wal_replay_pause()", replica=True)
    try:
        body = _one_gpu_for_an_hour("beta", pool, f"ryw-{uuid.uuid4()}")
        created = cluster.call("reservations/create", token, body)
        assert created.status_code == 201, created.text
        after = _gpu_row(cluster, token, "beta", pool)
        assert after["allocated"] == before["allocated"] + 1, (before, after)
        got = cluster.call(
            "reservations/get", token, {"tenantId": "beta", "reservationId": created.json()["id"]}
        )
        assert got.status_code == 200, got.text
        # The replica, frozen behind the write, is past the bound soon: every read leaves it.
        _wait_for(
            lambda: cluster.healthz()["replica"]["readsFrom"] == "primary", seconds=15, what="falling back"
        )
    finally:
        cluster.sql("SELECT pg_wal_replay_resume()", replica=True)
        cluster.launcher("resume")
    _wait_for(lambda: cluster.healthz()["replica"]["readsFrom"] == "replica", seconds=15, what="caught up")
    released = cluster.call(
        "reservations/release", token, {"tenantId": "beta", "reservationId": created.json()["id"]}
    )
    assert released.status_code == 200, released.text


def test_requests_keep_succeeding_when_an_api_replica_is_killed(cluster: Cluster) -> None:
    token = cluster.token("--tenant", "acme", "--role", "member", "--name", "kill")
    pool = _pool(cluster, token, "acme")
    cluster.launcher("kill-api", "2")
    try:
        for i in range(30):
            answer = cluster.call("capacity/summary", token, {"tenantId": "acme"})
            assert answer.status_code == 200, (i, answer.text)
        body = _one_gpu_for_an_hour("acme", pool, f"kill-{uuid.uuid4()}")
        for i in range(6):
            created = cluster.call(
                "reservations/create", token, body | {"idempotencyKey": f"kill-{i}-{uuid.uuid4()}"}
            )
            assert created.status_code == 201, (i, created.text)
            released = cluster.call(
                "reservations/release", token, {"tenantId": "acme", "reservationId": created.json()["id"]}
            )
            assert released.status_code == 200, (i, released.text)
    finally:
        cluster.launcher("start-api", "2")
    assert cluster.call("capacity/summary", token, {"tenantId": "acme"}).status_code == 200


def test_reads_fall_back_to_the_primary_while_the_replica_is_down(cluster: Cluster) -> None:
    token = cluster.token("--tenant", "gamma", "--role", "viewer", "--name", "fallback")
    pool = _pool(cluster, token, "gamma", name="h100-lab")
    cluster.launcher("stop-replica")
    try:
        for i in range(10):
            answer = cluster.call("capacity/byPool", token, {"tenantId": "gamma", "poolId": pool})
            assert answer.status_code == 200, (i, answer.text)
            assert cluster.call("capacity/summary", token, {"tenantId": "gamma"}).status_code == 200
        health = cluster.healthz()
        assert health["status"] == "ok", health
        assert health["replica"]["readsFrom"] == "primary", health["replica"]
        assert health["replica"]["available"] is False
    finally:
        cluster.launcher("start-replica")
    _wait_for(
        lambda: cluster.healthz()["replica"]["readsFrom"] == "replica", seconds=20, what="back on the replica"
    )
