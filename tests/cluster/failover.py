"""Writes under load through a database failover: `python -m tests.cluster.failover --fault kill-leader`.

tests/cluster/test_failover.py starts it. 16 clients book one GPU each and
release their oldest through the balancer, as fast as they are answered,
while the fault happens through the launcher of `make cluster`:

* `kill-leader`: SIGKILL to the leader's Patroni and PostgreSQL; Patroni
  promotes the synchronous standby once the leader key expires; then the
  killed member is started again and must come back as the synchronous
  standby (rewound if it held WAL nobody else had).
* `switchover`: `patronictl switchover` to the standby.

A request that failed (the API's 503 with Retry-After, the balancer's 502/503,
a dropped connection) is sent again: a create with its idempotencyKey, a
release with its id. Afterwards, on the leader: every reservation answered
201 and not released exists with its booking, every release answered 200 is
released, every key sent again made one reservation, and every invariant
holds (`operations.invariants`, and the rollups against a rebuild). Prints one
JSON line: the refusal window (the longest time no write succeeded), the
error answers seen, the problems; exits 1 when there is a problem.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import connection, connections  # noqa: E402

from tests.support.paths import ROOT  # noqa: E402
from tests.support.torture.ops import http_post  # noqa: E402

CLIENTS = 16
REQUEST_TIMEOUT = 30.0
HELD_PER_CLIENT = 3
# A request is sent again for this long at most: past it, the outage itself is the failure.
RETRY_SECONDS = 90.0


@dataclass
class Outcomes:
    """What the clients were answered, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    created: dict[str, str] = field(default_factory=dict)  # reservation id -> its key
    released: set[str] = field(default_factory=set)
    retried_keys: set[str] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    successes: list[float] = field(default_factory=list)  # when a write was answered
    failures: list[float] = field(default_factory=list)  # when a write was refused
    problems: list[str] = field(default_factory=list)
    slowest: float = 0.0  # the longest one request took to be answered

    def refused(self, kind: str, started: float) -> None:
        with self.lock:
            self.errors[kind] += 1
            self.failures.append(started)

    def succeeded(self) -> None:
        with self.lock:
            self.successes.append(time.monotonic())


def _send(base_url: str, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any] | str:
    """(status, answer), or what went wrong in transit as a word."""
    try:
        return http_post(base_url, path, token, body, timeout=REQUEST_TIMEOUT)
    except (ConnectionError, http.client.HTTPException) as error:
        return type(error).__name__
    except urllib.error.URLError as error:
        return type(error.reason).__name__ if isinstance(error.reason, Exception) else "URLError"


def _error_kind(answer: tuple[int, Any] | str) -> str:
    if isinstance(answer, str):
        return answer
    status, body = answer
    code = body.get("error", {}).get("code") if isinstance(body, dict) else None
    return f"{status} {code}" if code else str(status)


def write(outcomes: Outcomes, base_url: str, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One create or release, sent again (the same body: the same key, the same id) until it is answered."""
    deadline = time.monotonic() + RETRY_SECONDS
    attempt = 0
    while True:
        started = time.monotonic()
        answer = _send(base_url, path, token, body)
        with outcomes.lock:
            outcomes.slowest = max(outcomes.slowest, time.monotonic() - started)
        if not isinstance(answer, str) and answer[0] < 500:
            outcomes.succeeded()
            return answer
        outcomes.refused(_error_kind(answer), started)
        if "idempotencyKey" in body:
            with outcomes.lock:
                outcomes.retried_keys.add(body["idempotencyKey"])
        attempt += 1
        if time.monotonic() > deadline:
            return (599, f"still refused after {RETRY_SECONDS:.0f}s: {_error_kind(answer)}")
        time.sleep(min(1.0, 0.1 * attempt))


def client(
    n: int, outcomes: Outcomes, stop: threading.Event, base_url: str, token: str, tenant: str, pool: str
) -> None:
    held: list[str] = []
    count = 0
    rng = random.Random(n)
    while not stop.is_set():
        count += 1
        key = f"failover-{n}-{count}-{rng.getrandbits(32):08x}"
        body = {
            "tenantId": tenant,
            "poolId": pool,
            "devices": [{"class": "gpu", "count": 1}],
            "duration": "1h",
            "idempotencyKey": key,
        }
        status, answer = write(outcomes, base_url, "reservations/create", token, body)
        if status in (200, 201):
            with outcomes.lock:
                outcomes.created[answer["id"]] = key
            held.append(answer["id"])
        elif not (status == 409 and answer["error"]["code"] == "NO_CAPACITY"):
            with outcomes.lock:
                outcomes.problems.append(f"create {key}: {status} {answer!r}"[:300])
        if len(held) > HELD_PER_CLIENT or (held and stop.is_set()):
            target = held.pop(0)
            status, answer = write(
                outcomes,
                base_url,
                "reservations/release",
                token,
                {"tenantId": tenant, "reservationId": target},
            )
            if status == 200 and answer.get("state") == "released":
                with outcomes.lock:
                    outcomes.released.add(target)
            else:
                with outcomes.lock:
                    outcomes.problems.append(f"release {target}: {status} {answer!r}"[:300])


def launcher(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    result = subprocess.run(
        [sys.executable, "-m", "config.cluster", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"config.cluster {' '.join(args)}:\n{result.stdout}\n{result.stderr}")
    return result.stdout.strip()


def fleet() -> tuple[str, str, str]:
    """A tenant, a pool of 64 GPUs (more than the clients ever hold) and the tenant's token."""
    from core.services import token_issue
    from reservations.rollups.recount import rollup_rebuild_all
    from tests.support.factories import PoolFactory, TenantFactory
    from tests.support.placement import make_node

    tenant = TenantFactory.create(id=f"failover-{random.getrandbits(24):06x}")
    pool = PoolFactory.create(owner=tenant, name=f"failover-{tenant.id}", gpu_model="H100")
    for index in range(8):
        make_node(pool, gpus=8, hostname=f"{tenant.id}-{index}")
    rollup_rebuild_all()
    token = token_issue(tenant_id=tenant.id, role="member", name="failover")[1]
    connections.close_all()
    return tenant.id, pool.id, token


def refusal_window(outcomes: Outcomes) -> float:
    """The longest time in which no write was answered (refused writes and writes left waiting alike).

    PgBouncer holds a request while no leader answers, so most clients see a
    slow answer, not an error: the gap between answers is what they lived.
    """
    with outcomes.lock:
        times = sorted(outcomes.successes)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def checks(outcomes: Outcomes, tenant: str) -> list[str]:
    """Nothing answered is lost, each key made one reservation, every invariant holds."""
    from operations.invariants import invariant_report
    from tests.support.torture.checks import check_rollups_match_rebuild

    connections.close_all()
    problems: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id, r.state, r.idempotency_key, count(b.id) FROM reservations_reservation r"
            " JOIN reservations_allocation a ON a.reservation_id = r.id"
            " LEFT JOIN device_bookings b ON b.allocation_id = a.id"
            " WHERE r.tenant_id = %s GROUP BY 1, 2, 3",
            [tenant],
        )
        rows = {rid: (state, key, bookings) for rid, state, key, bookings in cursor.fetchall()}
    live = set(outcomes.created) - outcomes.released
    for rid in sorted(live):
        state, _key, bookings = rows.get(rid, ("missing", None, 0))
        if state not in ("scheduled", "active") or bookings != 1:
            problems.append(f"lost: {rid} answered 201, never released, is {state} with {bookings} bookings")
    for rid in sorted(outcomes.released):
        if rows.get(rid, ("missing",))[0] != "released":
            problems.append(f"lost release: {rid} answered 200 released, is {rows.get(rid, ('missing',))[0]}")
    made = Counter(key for _state, key, _bookings in rows.values())
    for key in sorted(outcomes.retried_keys):
        if made.get(key, 0) != 1:
            problems.append(f"key {key} sent again made {made.get(key, 0)} reservations")
    for rid, key in outcomes.created.items():
        if rid in rows and rows[rid][1] != key:
            problems.append(f"{rid} was answered for {key}, holds {rows[rid][1]}")
    for name, found in invariant_report().items():
        problems.extend(f"{name}: {problem}" for problem in found[:10])
    problems.extend(check_rollups_match_rebuild())
    return problems


def _led_by_another(killed: str) -> bool:
    members = json.loads(launcher("status", "--json"))
    return any(member["role"] == "leader" and member["name"] != killed for member in members)


def _answered_again(outcomes: Outcomes) -> bool:
    """Writes were refused, and one was answered after the last refusal."""
    with outcomes.lock:
        return bool(
            outcomes.failures and outcomes.successes and outcomes.successes[-1] > max(outcomes.failures)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="writes under load through a database failover")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--fault", choices=["kill-leader", "switchover"], required=True)
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before the fault")
    parser.add_argument("--after", type=float, default=3.0, help="seconds of load once all is back")
    options = parser.parse_args()
    tenant, pool, token = fleet()
    before_health = json.loads(urllib.request.urlopen(f"{options.base_url}/healthz", timeout=10).read())  # noqa: S310
    outcomes, stop = Outcomes(), threading.Event()
    threads = [
        threading.Thread(
            target=client, args=(n, outcomes, stop, options.base_url, token, tenant, pool), daemon=True
        )
        for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    time.sleep(options.before)
    said = launcher(options.fault)
    if options.fault == "kill-leader":
        # Once Patroni has promoted the other member and writes are answered again, the
        # killed member comes back (as a standby: the leader lock is no longer its own).
        killed = said.split()[-1]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (_led_by_another(killed) and _answered_again(outcomes)):
            time.sleep(0.3)
        said += "; " + (launcher("start-members") or "members started")
    else:
        launcher("start-members")  # waits until the former leader streams synchronously again
    time.sleep(options.after)
    stop.set()
    for thread in threads:
        thread.join(RETRY_SECONDS + REQUEST_TIMEOUT + 10)
    after_health = json.loads(urllib.request.urlopen(f"{options.base_url}/healthz", timeout=10).read())  # noqa: S310
    problems = list(outcomes.problems[:20])
    problems.extend(checks(outcomes, tenant)[:40])
    if before_health["writes"]["to"] == after_health["writes"]["to"]:
        problems.append(f"/healthz says writes still go to {before_health['writes']['to']}")
    report = {
        "fault": options.fault,
        "launcher": said,
        "refusalWindowSeconds": round(refusal_window(outcomes), 2),
        "refusedSpanSeconds": round(max(outcomes.failures) - min(outcomes.failures), 2)
        if outcomes.failures
        else 0,
        "slowestWriteSeconds": round(outcomes.slowest, 2),
        "errors": dict(outcomes.errors),
        "created": len(outcomes.created),
        "released": len(outcomes.released),
        "keysSentAgain": len(outcomes.retried_keys),
        "writesTo": [before_health["writes"], after_health["writes"]],
        "problems": problems,
    }
    print(json.dumps(report))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
