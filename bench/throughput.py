"""The write path over HTTP: create + release loops at 1, 4 and 16 clients, next to their SQL floor.

`python -m bench` runs the throughput at the largest fleet size only, and the
one-client loop (what planning costs as the fleet grows) at every size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.clock import Clock, console
from bench.database import BENCH_DB, Server

CLIENT_LEVELS = (1, 4, 16)
API_SECONDS = 10.0
FLOOR_SECONDS = 5.0
MODES = ("one pool", "spread")


def _fixed_target(assigned: list[tuple[str, str]]) -> Callable[[int, int], tuple[str, str]]:
    """Client i always books in `assigned[i]`."""
    return lambda client, _op: assigned[client]


def _assign(n: int, pools: dict[str, Any], mode: str) -> list[tuple[str, str]]:
    """The (tenantId, poolId) each of `n` clients books in: all the main pool, or pool i mod P."""
    if mode == "one pool":
        return [pools["main"]] * n
    spread = pools["exclusive"]
    return [spread[i % len(spread)] for i in range(n)]


def _split_atoms(assigned: list[tuple[str, str]], atoms: dict[str, list[Any]]) -> list[list[Any]]:
    """Each pool's free atoms dealt out to the clients booking in it, so no two clients share an atom."""
    out: list[list[Any]] = []
    for index, (_, pool_id) in enumerate(assigned):
        sharing = [i for i, (_, p) in enumerate(assigned) if p == pool_id]
        out.append(atoms[pool_id][sharing.index(index) :: len(sharing)])
    return out


def throughput_measure(
    *,
    server_info: Server,
    port: int,
    tokens: dict[str, str],
    pools: dict[str, Any],
    clock: Clock,
    label: str,
    log: Any,
) -> dict[str, Any]:
    """Creates per second through the API (with its lost races and replans), then through the SQL floor."""
    out: dict[str, Any] = {}
    with clock.step(f"{label}: API create + release, {API_SECONDS:.0f}s per run"):
        out["api"] = _api_runs(port=port, tokens=tokens, pools=pools, label=label, log=log)
    with clock.step(f"{label}: SQL floor, {FLOOR_SECONDS:.0f}s per run"):
        out.update(_floor_runs(conninfo=server_info.conninfo(BENCH_DB), pools=pools))
    return out


def _api_runs(
    *, port: int, tokens: dict[str, str], pools: dict[str, Any], label: str, log: Any
) -> dict[str, list[dict[str, Any]]]:
    """Per mode, one row per client level; `log` counts the server's log lines about placements."""
    from bench.load import Client, create_release_run

    out: dict[str, list[dict[str, Any]]] = {}
    for mode in MODES:
        for n in CLIENT_LEVELS:
            assigned = _assign(n, pools, mode)
            clients = [Client(port=port, token=tokens[tenant]) for tenant, _ in assigned]
            raced0, replans0 = log("placement lost a race"), log("placement replan")
            passed0 = log("placement passed over")
            result = create_release_run(
                clients=clients,
                seconds=API_SECONDS,
                target=_fixed_target(assigned),
                run_id=f"{label}-{mode}-{n}".replace(" ", ""),
            )
            for client in clients:
                client.close()
            row = result.as_dict()
            row["lost_races"] = log("placement lost a race") - raced0
            row["replans"] = log("placement replan") - replans0
            row["passed_over"] = log("placement passed over") - passed0
            out.setdefault(mode, []).append(row)
            console.print(
                f"  {mode:8} {n:2} clients: {row['creates_per_s']:7.1f} creates/s,"
                f" p50 {row['create_p50_ms']} ms, lost races {row['lost_races']},"
                f" passed over {row['passed_over']},"
                f" replans {row['replans']},"
                f" NO_CAPACITY {row['no_capacity']}, errors {row['other_errors']}"
            )
    return out


def _floor_runs(*, conninfo: str, pools: dict[str, Any]) -> dict[str, Any]:
    """The floor with the rollup row, without it, and with a delta log; per mode, one row per client level."""
    from bench.floor import ROLLUP_MODES, floor_run, free_atoms

    out: dict[str, Any] = {}
    atoms = free_atoms(conninfo=conninfo, pool_ids=[p for _, p in pools["exclusive"]], per_pool=64)
    variants = {"floor": "row", "floor_no_rollup": "none", "floor_delta_log": "log"}
    for key, rollup in variants.items():
        for mode in MODES if rollup == "row" else ("one pool",):
            for n in CLIENT_LEVELS:
                per_client = _split_atoms(_assign(n, pools, mode), atoms)
                floor = floor_run(
                    conninfo=conninfo,
                    atoms=per_client,
                    seconds=FLOOR_SECONDS,
                    run_id=f"{'abc'[ROLLUP_MODES.index(rollup)]}{n:x}",
                    rollup=rollup,
                )
                row = floor.as_dict()
                out.setdefault(key, {}).setdefault(mode, []).append(row)
                console.print(f"  {key:16} {mode:8} {n:2} clients: {row['creates_per_s']:7.1f} creates/s")
    return out


def create_one_client(
    *, port: int, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int
) -> dict[str, Any]:
    """One client's create + release loop in the main pool, at every size: what planning costs as it grows."""
    from bench.load import Client, create_release_run

    assigned = _assign(1, pools, "one pool")
    client = Client(port=port, token=tokens[assigned[0][0]])
    with clock.step(f"{nodes} nodes: create + release, 1 client, {API_SECONDS / 2:.0f}s"):
        result = create_release_run(
            clients=[client], seconds=API_SECONDS / 2, target=_fixed_target(assigned), run_id=f"one-{nodes}"
        )
    client.close()
    row = result.as_dict()
    console.print(f"  1 client: create p50 {row['create_p50_ms']} ms, {row['creates_per_s']:.1f} creates/s")
    return row
