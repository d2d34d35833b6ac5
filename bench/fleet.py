"""The fleet every bench measures: Django pointed at `bench_capacity`, a synthetic fleet loaded and filled.

`python -m bench` builds one per size; `python -m bench.profile` and
`python -m bench.worker` build one of their own the same way.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.clock import Clock, console
from bench.database import BENCH_DB, Server, database_recreate

BOOKINGS_PER_NODE = 100


def django_setup(server: Server) -> None:
    """Django (and its connections) on the benchmark database, `DEBUG` off."""
    os.environ["DATABASE_URL"] = server.url(BENCH_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    os.environ["DEBUG"] = "0"  # no query log growing with a million rows
    import django

    django.setup()


def fleet_build(
    *, server: Server, nodes: int, clock: Clock, after_load: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Recreate the database, load a synthetic fleet, run `after_load` (nothing booked yet), fill bookings."""
    from django.core.management import call_command
    from django.db import connections

    from bench.fill import bookings_fill

    connections.close_all()
    with clock.step(f"{nodes} nodes: recreate and migrate {BENCH_DB}"):
        database_recreate(server=server)
        call_command("migrate", verbosity=0, interactive=False)
    with clock.step(f"{nodes} nodes: make_fleet and load it"), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.json"
        with open(os.devnull, "w") as quiet:
            call_command("make_fleet", nodes=nodes, gpus_per_node=8, seed=1, out=str(path), stderr=quiet)
        data = json.loads(path.read_text())
        # Loaded as an operator loads a fleet file: `load_fleet` shows its progress
        # on a terminal and answers the ids as JSON.
        answer = io.StringIO()
        call_command("load_fleet", str(path), stdout=answer)
        ids = json.loads(answer.getvalue())
    if after_load is not None:
        after_load()
    with clock.step(f"{nodes} nodes: fill bookings"):
        filled = bookings_fill(conninfo=server.conninfo(BENCH_DB), target_bookings=nodes * BOOKINGS_PER_NODE)
    console.print(
        f"  {filled.bookings:,} bookings on {filled.atoms:,} GPU-class atoms ({filled.layers} per atom);"
        f" {filled.booked_now:,} booked now, {filled.booked_later:,} start later"
    )
    usage_close = _usage_close(clock, nodes)
    return {"ids": ids, "pools": data["pools"], "fill": filled.__dict__, "usage_close": usage_close}


def _usage_close(clock: Clock, nodes: int) -> dict[str, Any]:
    """Close every finished hour of the filled month as the worker's `usage-close` job does (same function).

    So `usage/hourly` below reads closed hours from the usage table, as it
    would on a service that has run for a month. The fill writes that month
    after the fact, which no service does: a worker that ran before it (the
    idle measurement) closed an empty hour ahead of that history, so the
    usage tables start empty here, as on a database the worker never saw.
    """
    from django.db import connection

    from capacity.models import HourlyUsage, UsageHour
    from capacity.services import usage_close_due

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE capacity_hourlyusage, capacity_usagehour")
    with clock.step(f"{nodes} nodes: usage-close over the filled month"):
        started = time.perf_counter()
        hours = usage_close_due()
        seconds = time.perf_counter() - started
    rows = HourlyUsage.objects.count()
    console.print(f"  {hours:,} hours closed into {rows:,} usage rows in {seconds:.1f}s")
    return {
        "hours": hours,
        "rows": rows,
        "seconds": round(seconds, 2),
        "closed_hours": UsageHour.objects.count(),
    }


def tokens_issue() -> dict[str, str]:
    """A member token for each of the fleet's tenants."""
    from core.services import token_issue

    return {
        tenant: token_issue(tenant_id=tenant, role="member", name=f"bench {tenant}")[1]
        for tenant in ("acme", "beta", "gamma")
    }


def pool_ids(fleet: dict[str, Any]) -> dict[str, Any]:
    """The H100 exclusive pool the single-pool measurements use, and every exclusive pool."""
    ids = fleet["ids"]["pools"]
    exclusive = [p for p in fleet["pools"] if p["sharing"] == "exclusive"]
    h100 = next(p for p in exclusive if p["gpuModel"] == "H100")
    return {
        "main": (h100["owner"], ids[f"{h100['owner']}/{h100['name']}"]),
        "exclusive": [(p["owner"], ids[f"{p['owner']}/{p['name']}"]) for p in exclusive],
    }
