"""A backup restored to a point in time: the ledger as it was then, row for row, and its invariants hold.

Book, take a full backup (`make backup`), book more, note the time, then book
and release more; restore to the noted time (`make restore TARGET_TIME=...`:
the backup and the archived WAL into a new data directory, a server and an
API of its own on it). The restored reservations, bookings, quota and rollups
equal what the leader held at that time, `manage.py check_invariants` passes
on it, and its API answers for what existed then and not for what came after.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import requests

from tests.cluster.client import REQUEST_TIMEOUT, Cluster
from tests.support.paths import ROOT

pytestmark = pytest.mark.cluster

TENANT = "acme"

# The ledger of one tenant and its pool: what a restore must give back exactly.
_OF_TENANT = (
    " JOIN reservations_allocation a ON a.id = b.allocation_id"
    " JOIN reservations_reservation r ON r.id = a.reservation_id WHERE r.tenant_id = %(tenant)s"
)
LEDGER = {
    "reservations": "SELECT id, state, idempotency_key, starts_at, ends_at, released_at"
    " FROM reservations_reservation WHERE tenant_id = %(tenant)s ORDER BY id",
    "bookings": "SELECT b.id, b.device_id, b.allocation_id, b.during::text, b.phase FROM device_bookings b"
    f"{_OF_TENANT} ORDER BY b.id",
    "allocations": "SELECT a.id, a.node_id, a.released FROM reservations_allocation a"
    " JOIN reservations_reservation r ON r.id = a.reservation_id"
    " WHERE r.tenant_id = %(tenant)s ORDER BY a.id",
    "quota": "SELECT pool_id, resource, used, max, mode FROM quota_usage"
    " WHERE tenant_id = %(tenant)s ORDER BY 1, 2",
    "rollups": "SELECT * FROM pool_capacity_rollup WHERE pool_id = %(pool)s ORDER BY resource",
}


def _ledger(cluster: Cluster, pool: str, *, port: int | None = None, at: bool = False) -> dict[str, Any]:
    """The ledger's rows; with `at`, in one snapshot with the time it was read (the restore's target)."""
    import psycopg

    port = port or cluster.primary_port
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found: dict[str, Any] = {
            name: conn.execute(query, {"tenant": TENANT, "pool": pool}).fetchall()
            for name, query in LEDGER.items()
        }
        if at:
            row = conn.execute(
                "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'"
            ).fetchone()
            assert row is not None
            found["at"] = row[0]
    return found


def _book(cluster: Cluster, token: str, pool: str, count: int) -> list[str]:
    made = []
    for _ in range(count):
        body = {
            "tenantId": TENANT,
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "2h",
            "idempotencyKey": f"backup-{uuid.uuid4()}",
        }
        answer = cluster.call("reservations/create", token, body)
        assert answer.status_code == 201, answer.text
        made.append(answer.json()["id"])
    return made


def _release(cluster: Cluster, token: str, ids: list[str]) -> None:
    for rid in ids:
        answer = cluster.call("reservations/release", token, {"tenantId": TENANT, "reservationId": rid})
        assert answer.status_code == 200, answer.text


def test_a_point_in_time_restore_gives_back_the_ledger_of_that_time(cluster: Cluster) -> None:
    token = cluster.token("--tenant", TENANT, "--role", "member", "--name", "backup")
    summary = cluster.call("capacity/summary", token, {"tenantId": TENANT})
    pool = next(p["poolId"] for p in summary.json()["pools"] if p["name"] == "h100-east")
    first = _book(cluster, token, pool, 2)
    cluster.launcher("backup")
    second = _book(cluster, token, pool, 2)
    _release(cluster, token, first[:1])
    # The worker's pass moves nothing of these (they run from their start); let it settle.
    time.sleep(2)
    then = _ledger(cluster, pool, at=True)
    time.sleep(1)
    later = _book(cluster, token, pool, 2)
    _release(cluster, token, [first[1], second[0]])
    assert _ledger(cluster, pool) != {k: v for k, v in then.items() if k != "at"}

    cluster.launcher("restore", "--target-time", then["at"])

    port = cluster.state()["restored_port"]
    restored = _ledger(cluster, pool, port=port)
    for name in LEDGER:
        assert restored[name] == then[name], f"{name}: restored {restored[name]}\nat the time {then[name]}"
    invariants = subprocess.run(
        [sys.executable, "manage.py", "check_invariants"],
        cwd=ROOT,
        env=cluster.env | {"DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/postgres"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert invariants.returncode == 0, invariants.stdout + invariants.stderr
    assert "invariants hold" in invariants.stdout
    # The API on the restored database: what existed then is there, what came after is not.
    api = f"http://127.0.0.1:{int(cluster.env['CLUSTER_PORT']) + 9}/api/compute/reservations/get"
    headers = {"Authorization": f"Bearer {token}"}
    for rid, status in ((second[1], 200), (later[0], 404)):
        answer = requests.post(
            api, json={"tenantId": TENANT, "reservationId": rid}, headers=headers, timeout=REQUEST_TIMEOUT
        )
        assert answer.status_code == status, (rid, answer.text)
    _release(cluster, token, [second[1], *later])
