"""How statements reach PostgreSQL, and what each way costs a create and a release.

`python -m bench.binding --nodes N` (or `--reuse-db` on a fleet kept by
`python -m bench.profile --keep-db`) profiles the same create + release
(`bench.profile.profile_run`) with the connection set four ways, taking turns
round by round so that a machine that slows down slows them all alike:

* bound in the process: Django's default, and the service's behind a
  transaction pooler: every statement is new text to the server;
* bound on the server, never prepared: the text repeats, but is parsed and
  planned on every run;
* prepared, planned every run: parsed once per connection, planned on every
  run (`plan_cache_mode=force_custom_plan`);
* prepared: the service's way (`config.database.service_postgres`).

Printed per way: the request's wall p50, the server process's CPU p50 and the
database backend's CPU per create + release (from `/proc`, where the server
runs on this machine).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.profile import fleet_arguments, main_pool_ready, profile_run

console = Console()


@dataclass(frozen=True)
class Way:
    name: str
    server_side_binding: bool
    prepare_threshold: int | None
    options: str = ""


WAYS = (
    Way("bound in the process", False, None),
    Way("bound on the server, never prepared", True, None),
    Way("prepared, planned every run", True, 5, "-c plan_cache_mode=force_custom_plan"),
    Way("prepared", True, 5),
)


def _connect_as(way: Way) -> None:
    """The default connection, closed and set to `way`: the next statement opens it anew."""
    from django.db import connection

    connection.close()
    options = connection.settings_dict["OPTIONS"]
    options["server_side_binding"] = way.server_side_binding
    options["prepare_threshold"] = way.prepare_threshold
    if way.options:
        options["options"] = way.options
    else:
        options.pop("options", None)


def binding_run(*, token: str, tenant_id: str, pool_id: str, rounds: int, samples: int) -> dict[str, Any]:
    """Each way in turn, `rounds` times, `samples` creates + releases each; the medians of the rounds."""
    measured: dict[str, list[dict[str, float]]] = {way.name: [] for way in WAYS}
    for index in range(rounds):
        for way in WAYS:
            _connect_as(way)
            profile = profile_run(
                token=token, tenant_id=tenant_id, pool_id=pool_id, samples=samples, warmup=10
            )
            db = [profile[op]["db_cpu_mean_ms"] for op in ("create", "release")]
            measured[way.name].append(
                {
                    "wall_ms": profile["create"]["p50_ms"] + profile["release"]["p50_ms"],
                    "cpu_ms": profile["create"]["cpu_p50_ms"] + profile["release"]["cpu_p50_ms"],
                    "db_cpu_ms": sum(db) if None not in db else float("nan"),
                }
            )
        console.print(f"  round {index + 1} of {rounds} done")
    _connect_as(WAYS[-1])
    return {
        name: {key: round(statistics.median(r[key] for r in rows), 2) for key in rows[0]}
        for name, rows in measured.items()
    }


def print_binding(result: dict[str, Any], *, title: str) -> None:
    table = Table(title=title)
    table.add_column("way", no_wrap=True)
    table.add_column("wall p50 ms", justify="right")
    table.add_column("server CPU p50 ms", justify="right")
    table.add_column("database CPU ms", justify="right")
    for name, row in result.items():
        table.add_row(name, f"{row['wall_ms']:.1f}", f"{row['cpu_ms']:.2f}", f"{row['db_cpu_ms']:.1f}")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.binding", description=__doc__)
    fleet_arguments(parser)
    parser.add_argument("--rounds", type=int, default=5, help="turns of the four ways")
    parser.add_argument("--samples", type=int, default=60, help="creates + releases per way and round")
    args = parser.parse_args(argv)

    from bench.clock import Clock

    clock = Clock()
    with main_pool_ready(nodes=args.nodes, reuse_db=args.reuse_db, keep_db=args.keep_db, clock=clock) as (
        token,
        tenant,
        pool_id,
    ):
        with clock.step(f"{len(WAYS)} ways, {args.rounds} rounds, {args.samples} creates + releases"):
            result = binding_run(
                token=token, tenant_id=tenant, pool_id=pool_id, rounds=args.rounds, samples=args.samples
            )
        print_binding(result, title=f"per create + release, medians of {args.rounds} rounds")


if __name__ == "__main__":
    main()
