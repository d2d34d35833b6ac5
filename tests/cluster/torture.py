"""The torture run through a cluster: `python -m tests.cluster.torture` (tests/cluster starts it).

It runs against the cluster's primary directly (DATABASE_URL) to build the
fleet and to judge the result, and sends every operation through the
balancer (`--base-url`) while the faults happen: an API replica killed
outright and started again, the streaming replica stopped and started again
(through `config.cluster`, the launcher's own commands).

* The 1,000 concurrent operations of the torture tests (creates, releases,
  node operations, repairs) from 16 clients, with the capacity reads that may
  go to the replica between them; then every invariant, the commit-order log's
  verdicts and the rollups against a rebuild.
* The fill: 16 clients take one GPU each until the pool refuses; it must book
  exactly the pool's allocatable GPUs.
* A request that failed in transit (the balancer's 502 or 503 when its replica
  died with the request in flight, a dropped connection, or an answer cut off
  mid-body) is sent again, a create with the same idempotencyKey; each key
  made one reservation.
* No request hung: every one answered within `REQUEST_TIMEOUT`.

Prints one JSON line of numbers and exits 1 with the problems when any check fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
from collections import Counter
from collections.abc import Callable
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import connection, connections  # noqa: E402

from tests.support.clock import now_ms  # noqa: E402
from tests.support.paths import ROOT  # noqa: E402
from tests.support.threads import Dealer, threads_run  # noqa: E402
from tests.support.torture.checks import Sampler, problems_after_run  # noqa: E402
from tests.support.torture.fleet import Fleet, fleet_logged  # noqa: E402
from tests.support.torture.ops import Ledger, Op, Tally, http_post, op_run_http, ops_generate  # noqa: E402
from tests.support.torture.servers import http_tokens  # noqa: E402

CLIENTS = 16
REQUEST_TIMEOUT = 30.0
# What a request that failed in transit answers: the balancer's own errors, and none of the API's.
IN_TRANSIT = (502, 503, 504)
RETRIES = 8


class Flaky(Exception):
    """A request that may not have reached a server, or whose answer was lost: send it again."""


# What a request whose connection failed raises: refused, reset, or cut in the middle of its
# answer (`http.client.IncompleteRead`, when the replica serving it is killed).
TRANSPORT_ERRORS = (ConnectionError, http.client.HTTPException, urllib.error.URLError)


def lost_in_transit(error: BaseException) -> bool:
    """A transport error that may be sent again; a timeout (a hung request) is not: it fails the run."""
    return not (isinstance(error, urllib.error.URLError) and isinstance(error.reason, TimeoutError))


def post(base_url: str, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """`http_post`, with a failure in transit raised as `Flaky`; a timeout (a hung request) is not."""
    try:
        status, answer = http_post(base_url, path, token, body, timeout=REQUEST_TIMEOUT)
    except TRANSPORT_ERRORS as error:
        if not lost_in_transit(error):
            raise
        raise Flaky(repr(error)) from error
    if status in IN_TRANSIT:
        raise Flaky(f"{status} {answer!r}")
    return status, answer


class Run:
    """The counters of one run, shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.retries: Counter[str] = Counter()
        self.retried_keys: dict[str, str] = {}
        self.slowest = 0.0
        self.read_failures: list[str] = []
        self.reads = 0

    def timed(self, call: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return call()
        finally:
            with self.lock:
                self.slowest = max(self.slowest, time.monotonic() - started)


def with_retries(run: Run, kind: str, call: Callable[[], Any]) -> Any:
    for attempt in range(RETRIES):
        try:
            return run.timed(call)
        except Flaky:
            with run.lock:
                run.retries[kind] += 1
            time.sleep(0.2 * (attempt + 1))
    return run.timed(call)


def op_run(op: Op, ledger: Ledger, run: Run, *, base_url: str, tokens: dict[str, str], fleet: Fleet) -> str:
    """One operation through the balancer; a create or a release failed in transit is sent again."""
    if op.kind == "create":
        body = op.args["body"]

        def create() -> str:
            return op_run_http(op, ledger, base_url=base_url, tokens=tokens, fleet=fleet)

        outcome = with_retries(run, "create", create_checked(create, run, body["idempotencyKey"]))
        return str(outcome)
    if op.kind == "release":
        target = ledger.take(op.args["pick"])
        if target is None:
            return "nothing-to-release"
        tenant_id, reservation_id = target
        body = {"tenantId": tenant_id, "reservationId": reservation_id}

        def release() -> str:
            status, answer = post(base_url, "reservations/release", tokens[tenant_id], body)
            ok = status == 200 and answer["state"] == "released"
            return "released" if ok else f"release {status} {answer!r}"

        return str(with_retries(run, "release", release))

    def node_op() -> str:
        # A node operation sets a state (cordoned, tainted, healthy...): sending it again is safe.
        try:
            outcome = op_run_http(op, ledger, base_url=base_url, tokens=tokens, fleet=fleet)
        except TRANSPORT_ERRORS as error:
            if not lost_in_transit(error):
                raise
            raise Flaky(f"{op.kind} answered in transit {error!r}") from error
        if any(f"answered {status}" in outcome for status in IN_TRANSIT):
            raise Flaky(outcome)
        return outcome

    return str(with_retries(run, op.kind, node_op))


def create_checked(create: Callable[[], str], run: Run, key: str) -> Callable[[], str]:
    """A create whose failure in transit (`create answered 502 ...`) is raised as `Flaky`, its key noted."""

    def call() -> str:
        try:
            outcome = create()
        except TRANSPORT_ERRORS as error:
            if not lost_in_transit(error):
                raise
            outcome = f"create answered in transit {error!r}"
        if outcome.startswith(("create answered 50", "create answered in transit")):
            with run.lock:
                run.retried_keys[key] = outcome
            raise Flaky(outcome)
        return outcome

    return call


def read_summary(run: Run, base_url: str, token: str, tenant_id: str) -> None:
    """A capacity read between the operations: to the replica when it keeps up, else to the primary."""

    def read() -> None:
        status, answer = post(base_url, "capacity/summary", token, {"tenantId": tenant_id})
        if status != 200:
            with run.lock:
                run.read_failures.append(f"{status} {answer!r}"[:300])

    with_retries(run, "read", read)
    with run.lock:
        run.reads += 1


def launcher(*args: str) -> None:
    """A fault, by the launcher of `make cluster` (it finds the cluster by CLUSTER_DIR)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    subprocess.run([sys.executable, "-m", "config.cluster", *args], cwd=ROOT, env=env, check=True)


def faults_at(operations: int) -> dict[int, tuple[str, ...]]:
    """Which fault the client that takes operation i injects first: all inside the run."""
    return {
        operations * 2 // 10: ("kill-api", "2"),
        operations * 35 // 100: ("stop-replica",),
        operations * 5 // 10: ("start-api", "2"),
        operations * 7 // 10: ("start-replica",),
    }


def operations_run(fleet: Fleet, *, base_url: str, operations: int, seed: int) -> tuple[Tally, Run, Sampler]:
    tokens = http_tokens(fleet)
    reader = tokens[fleet.tenants[1]]
    ops = ops_generate(fleet=fleet, seed=seed, count=operations, now_ms=now_ms(), key_prefix="cluster")
    ledger, tally, run = Ledger(), Tally(), Run()
    sampler = Sampler(every=25)
    faults = faults_at(operations)
    # Each fault starts once the one before it has finished, whichever client threads take them.
    done = {index: threading.Event() for index in faults}
    before = dict(zip(sorted(faults)[1:], sorted(faults), strict=False))
    queue = Dealer(enumerate(ops))

    def client() -> None:
        try:
            while (item := queue.next()) is not None:
                index, op = item
                if index in faults:
                    if index in before:
                        done[before[index]].wait()
                    launcher(*faults[index])
                    done[index].set()
                try:
                    sampler.maybe(index)
                    outcome = op_run(op, ledger, run, base_url=base_url, tokens=tokens, fleet=fleet)
                    if index % 4 == 0:
                        read_summary(run, base_url, reader, fleet.tenants[1])
                except Exception as exc:  # a hung request or an unexpected answer fails the run
                    outcome = f"error: {type(exc).__name__}: {exc}"
                tally.record(op, outcome)
        finally:
            connections.close_all()

    threads_run(client, CLIENTS, seconds=1800)
    return tally, run, sampler


def fill_run(*, base_url: str, run: Run) -> tuple[int, int, int, list[str]]:
    """16 clients take one GPU each until NO_CAPACITY; an API replica is killed and restarted meanwhile."""
    from core.services import token_issue
    from reservations.models import DeviceBooking, PoolCapacityRollup, Reservation
    from reservations.rollups.recount import rollup_rebuild_all
    from tests.support.factories import PoolFactory, TenantFactory
    from tests.support.placement import make_node

    tenant = TenantFactory.create(id="fill-tenant")
    pool = PoolFactory.create(owner=tenant, name="fill", gpu_model="H100")
    for _ in range(4):
        make_node(pool, gpus=8)
    rollup_rebuild_all()
    allocatable = PoolCapacityRollup.objects.get(pool=pool, resource="gpu").allocatable
    token = token_issue(tenant_id=tenant.id, role="member", name="fill")[1]
    made: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    killed = threading.Event()
    counter = iter(range(10**6))

    def client() -> None:
        try:
            while True:
                with lock:
                    n = next(counter)
                if n == 8:
                    launcher("kill-api", "3")
                    killed.set()
                if n == 20:
                    # After the kill has finished, whichever client thread took n == 8.
                    killed.wait()
                    launcher("start-api", "3")
                body = {
                    "tenantId": tenant.id,
                    "poolId": pool.id,
                    "devices": [{"class": "gpu", "count": 1}],
                    "duration": "1h",
                    "idempotencyKey": f"fill-{n}",
                }

                def create(body: dict[str, Any] = body) -> tuple[int, Any]:
                    try:
                        return post(base_url, "reservations/create", token, body)
                    except Flaky as error:
                        with run.lock:
                            run.retried_keys[body["idempotencyKey"]] = str(error)
                        raise

                status, answer = with_retries(run, "fill", create)
                if status in (200, 201):
                    with lock:
                        made.append(answer["id"])
                    continue
                if status == 409 and answer["error"]["code"] == "NO_CAPACITY":
                    return
                with lock:
                    failures.append(f"fill: {status} {answer!r}"[:300])
                return
        finally:
            connections.close_all()

    threads_run(client, CLIENTS, seconds=600)
    booked = DeviceBooking.objects.filter(device__node__pool=pool, allocation__isnull=False).count()
    reservations = Reservation.objects.filter(pool=pool).count()
    if len(set(made)) != len(made):
        failures.append("fill: one reservation answered to two creates")
    return allocatable, len(made), booked if booked == reservations else -reservations, failures


def keys_made_one_reservation_each(keys: list[str]) -> list[str]:
    """Every create sent again made exactly one reservation (the unique key holds them to one)."""
    if not keys:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key, count(*) FROM reservations_reservation"
            " WHERE idempotency_key = ANY(%s) GROUP BY 1",
            [keys],
        )
        counts = dict(cursor.fetchall())
    return [f"key {key}: {counts.get(key, 0)} reservations" for key in keys if counts.get(key, 0) > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description="the torture run through a cluster")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261201)
    options = parser.parse_args()
    problems: list[str] = []
    started = time.monotonic()
    with fleet_logged() as fleet:
        tally, run, sampler = operations_run(
            fleet, base_url=options.base_url, operations=options.operations, seed=options.seed
        )
        problems.extend(tally.failures[:20])
        problems.extend(sampler.problems[:20])
        problems.extend(run.read_failures[:20])
        if tally.total != options.operations:
            problems.append(f"{tally.total} of {options.operations} operations ran")
        if not (tally.counts["created"] and tally.counts["released"] and tally.counts["node-op"]):
            problems.append(f"the run contested nothing: {dict(tally.counts)}")
        problems.extend(problems_after_run(fleet))
    operations_seconds = time.monotonic() - started
    allocatable, made, booked, fill_problems = fill_run(base_url=options.base_url, run=run)
    problems.extend(fill_problems)
    problems.extend(keys_made_one_reservation_each(sorted(run.retried_keys)))
    if not (allocatable == made == booked):
        problems.append(f"fill: {allocatable} allocatable GPUs, {made} reservations, {booked} bookings")
    report = {
        "operations": dict(tally.counts),
        "operationsSeconds": round(operations_seconds, 1),
        "reads": run.reads,
        "retries": dict(run.retries),
        "createsSentAgain": len(run.retried_keys),
        "snapshotsMidRun": sampler.samples,
        "slowestRequestSeconds": round(run.slowest, 2),
        "fill": {"allocatable": allocatable, "reservations": made, "bookings": booked},
        "problems": problems[:40],
    }
    print(json.dumps(report))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
