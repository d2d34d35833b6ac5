"""Human output of reservations: one reservation's fields and allocations, and the tenant's list."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from better_compute.render import local_time, print_whole_table

STATE_STYLES = {
    "active": "green",
    "scheduled": "cyan",
    "ended": "dim",
    "released": "dim",
    "preempted": "red",
}


def _atom_count(reservation: dict[str, Any]) -> int:
    return sum(len(a.get("atoms") or []) for a in reservation.get("allocations") or [])


def reservation(out: Console, r: dict[str, Any], *, title: str = "Reservation") -> None:
    grid = Table(title=f"{title} {r['id']}", title_justify="left", show_header=False)
    grid.add_column("field", style="bold")
    grid.add_column("value")
    grid.add_row("state", Text(r["state"], style=STATE_STYLES.get(r["state"], "")))
    grid.add_row("tenant", r["tenantId"])
    grid.add_row("pool", r["poolId"])
    grid.add_row("project", r.get("projectId") or "-")
    grid.add_row("start", local_time(r.get("start")))
    grid.add_row("end", local_time(r.get("end")))
    grid.add_row("binding", r.get("binding") or "-")
    grid.add_row("spot", "yes" if r.get("spot") else "no")
    grid.add_row("lease expires", local_time(r.get("leaseExpiresAt")))
    grid.add_row("idempotency key", r.get("idempotencyKey") or "-")
    grid.add_row("created", local_time(r.get("createdAt")))
    notice = r.get("notice")
    if notice:
        grid.add_row(
            "notice",
            Text(
                f"given {local_time(notice.get('at'))}, ends {local_time(notice.get('endsAt'))}",
                style="red",
            ),
        )
    risk = r.get("atRisk")
    if risk:
        grid.add_row(
            "at risk",
            Text(f"since {local_time(risk.get('since'))}: {risk.get('reason', '')}", style="red"),
        )
    out.print(grid)
    allocations = r.get("allocations") or []
    if allocations:
        table = Table(title="Allocations", title_justify="left")
        table.add_column("allocation", no_wrap=True, min_width=max(len(a["id"]) for a in allocations))
        table.add_column("node", no_wrap=True, min_width=max(len(a["nodeId"]) for a in allocations))
        table.add_column("atoms", justify="right")
        table.add_column("devices", overflow="fold")
        table.add_column("resources", overflow="fold")
        for allocation in allocations:
            resources = allocation.get("resources") or {}
            table.add_row(
                allocation["id"],
                allocation["nodeId"],
                str(len(allocation["atoms"])),
                ", ".join(allocation["atoms"]),
                ", ".join(f"{k}={v}" for k, v in sorted(resources.items())) or "-",
            )
        out.print(table)


def reservation_list(out: Console, reservations: list[dict[str, Any]], *, more: bool) -> None:
    if not reservations:
        out.print("No reservations.")
        return
    headers = ["id", "state", "pool", "start", "end", "atoms", "spot"]
    # Ids whole (they are copied into `get`, `release`); times to the minute.
    rows: list[list[Any]] = [
        [
            r["id"],
            Text(r["state"], style=STATE_STYLES.get(r["state"], "")),
            r["poolId"],
            local_time(r.get("start"), timespec="minutes"),
            local_time(r.get("end"), timespec="minutes"),
            str(_atom_count(r)),
            "yes" if r.get("spot") else "no",
        ]
        for r in reservations
    ]
    print_whole_table(
        out,
        f"Reservations, newest first ({len(reservations)})",
        lambda _: (headers, rows),
        {"atoms"},
        bars=False,
    )
    if more:
        out.print(Text("More on the next page: add --all to follow nextCursor.", style="dim"))
