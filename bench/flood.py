"""The waiting flood: tenant B's `capacity/summary` while tenant A floods creates that wait.

`python -m bench.flood` (run by `make bench` after the fleet benchmarks):
the demo fleet in its own database, a production server (gunicorn, threads),
tenant A's pool filled, then A sends 200 creates at once that cannot fit and
ask to wait 30 s. B's summary p50 is measured before (quiet) and during the
flood; the target is at most 2x the quiet figure. It also reports how A's
creates were answered (429 beyond the waiting bounds, 409 after the wait) and
the database backends the server holds during the flood (waiters hold none).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.database import database_drop, database_recreate, server_find
from bench.load import Client, latency_measure

FLOOD_DB = "bench_flood"
FLOOD_CREATES = 200
WAIT_MS = 30000
TARGET_RATIO = 2.0
OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "flood.json"
console = Console(stderr=True)


def _setup(conninfo_url: str) -> dict[str, Any]:
    import os

    os.environ["DATABASE_URL"] = conninfo_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-flood")
    os.environ["DEBUG"] = "0"
    import django

    django.setup()
    from django.core.management import call_command

    from core.services import token_issue
    from fleets.load import fleet_load
    from inventory.models import Pool
    from reservations.rollups.recount import rollup_rebuild_all

    call_command("migrate", verbosity=0, interactive=False)
    demo = Path(__file__).resolve().parents[1] / "fleets" / "demo.json"
    fleet_load(data=json.loads(demo.read_text()))
    rollup_rebuild_all()
    pool = Pool.objects.get(owner_id="acme", name="h100-east")
    return {
        "a": token_issue(tenant_id="acme", role="member", name="flood a")[1],
        "b": token_issue(tenant_id="beta", role="member", name="flood b")[1],
        "pool": pool.pk,
    }


def _fill(client: Client, pool_id: str) -> int:
    """Book every GPU of A's pool for the next hour, a GPU at a time, so A's creates never fit."""
    taken = 0
    while True:
        status, _ = client.call(
            "reservations/create",
            {
                "tenantId": "acme",
                "poolId": pool_id,
                "devices": [{"class": "gpu", "count": 1}],
                "duration": "1h",
                "idempotencyKey": f"fill-{taken}",
            },
        )
        if status != 201:
            return taken
        taken += 1


def _backends(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [FLOOD_DB]
        ).fetchone()
    return int(row[0]) if row else 0


def run(*, keep_db: bool = False) -> dict[str, Any]:
    from bench.server import Gunicorn

    server = server_find()
    database_recreate(server=server, dbname=FLOOD_DB)
    setup = _setup(server.url(FLOOD_DB))
    log_path = Path(tempfile.gettempdir()) / "bench-flood-gunicorn.log"
    # The production shape the README documents: threads per worker, more than the waiting bound.
    with Gunicorn(database_url=server.url(FLOOD_DB), log_path=log_path, workers=2, threads=24) as gunicorn:
        port = gunicorn.port
        filled = _fill(Client(port=port, token=setup["a"]), setup["pool"])
        b = Client(port=port, token=setup["b"])
        summary = {"tenantId": "beta"}
        quiet = latency_measure(client=b, method="capacity/summary", body=lambda _: summary, n=200)

        answers: dict[int, int] = {}
        lock = threading.Lock()

        def flood_one(index: int) -> None:
            client = Client(port=port, token=setup["a"])
            status, _ = client.call(
                "reservations/create",
                {
                    "tenantId": "acme",
                    "poolId": setup["pool"],
                    "devices": [{"class": "gpu", "count": 1}],
                    "duration": "1h",
                    "idempotencyKey": f"flood-{index}",
                    "wait": {"timeoutMs": WAIT_MS},
                },
            )
            client.close()
            with lock:
                answers[status] = answers.get(status, 0) + 1

        threads = [threading.Thread(target=flood_one, args=(i,)) for i in range(FLOOD_CREATES)]
        for thread in threads:
            thread.start()
        time.sleep(2)  # the refusals are answered; the waiters wait
        backends_during = _backends(server.conninfo(FLOOD_DB))
        flooded = latency_measure(client=b, method="capacity/summary", body=lambda _: summary, n=200)
        for thread in threads:
            thread.join(WAIT_MS / 1000 + 30)
        b.close()
    ratio = flooded.p50 / quiet.p50
    result = {
        "creates": FLOOD_CREATES,
        "wait_ms": WAIT_MS,
        "filled_gpus": filled,
        "quiet": quiet.as_dict(),
        "flooded": flooded.as_dict(),
        "ratio_p50": round(ratio, 2),
        "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
        "flood_answers": {str(k): v for k, v in sorted(answers.items())},
        "server_backends_during_flood": backends_during,
    }
    from django.db import connections

    connections.close_all()
    if not keep_db:
        database_drop(server=server, dbname=FLOOD_DB)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    parser.add_argument("--keep-db", action="store_true", help=f"keep {FLOOD_DB} after the run")
    parser.add_argument("--no-docs", action="store_true", help=f"print only; do not write {OUT}")
    args = parser.parse_args(argv)
    result = run(keep_db=args.keep_db)
    verdict = "[green]met[/]" if result["met"] else "[red]missed[/]"
    console.print(
        f"flood: tenant B's summary p50 {result['quiet']['p50_ms']:.1f} ms quiet, "
        f"{result['flooded']['p50_ms']:.1f} ms while A floods {FLOOD_CREATES} waiting creates "
        f"({result['ratio_p50']}x, target <= {TARGET_RATIO}x: {verdict}); "
        f"A's answers {result['flood_answers']}; "
        f"server backends during the flood: {result['server_backends_during_flood']}"
    )
    if not args.no_docs:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
