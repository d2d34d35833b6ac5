"""Human output: rich tables, bars, and times in the local time zone.

Every function takes the API's answer as it came and prints it; nothing here
changes what a command does. The bars use a different character per part, so
they still read without colour (in a pipe, or with NO_COLOR):
`█` allocated or booked, `▓` reserved, `░` available or free, `·` not allocatable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

BAR_WIDTH = 24
COUNTS = ("total", "allocatable", "allocated", "reserved", "available")
BUCKETS = ("provisioning", "unhealthy", "maintenance", "unreachable")
# The resource that headlines a pool of each sharing mode: the device class it sells (else `gpu`).
HEADLINE = {"mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot"}


def console(file: TextIO | None = None) -> Console:
    """A console on stdout; outside a terminal, wide enough for the tables (COLUMNS wins when set)."""
    out = file or sys.stdout
    width = None
    if not out.isatty() and not os.environ.get("COLUMNS"):
        width = 160
    return Console(file=out, width=width, highlight=False, soft_wrap=False)


# --- Times -------------------------------------------------------------------------


def local_time(ms: int | None, *, timespec: str = "seconds") -> str:
    """Epoch milliseconds as ISO-8601 in the local time zone; `-` for none."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone().isoformat(timespec=timespec)


def short_local_time(ms: int) -> str:
    """`2026-05-04T14:00`: minutes, local time, no offset (the header states the zone)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone().strftime("%Y-%m-%dT%H:%M")


def zone_name(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone()
    offset = moment.strftime("%z")
    return f"{moment.tzname() or 'local'} (UTC{offset[:3]}:{offset[3:]})"


# --- Bars --------------------------------------------------------------------------


def stacked_bar(parts: Iterable[tuple[int, str, str]], scale: int, width: int = BAR_WIDTH) -> Text:
    """Parts `(count, character, style)` laid end to end on `width` cells; the rest is `·`.

    Boundaries are rounded from cumulative sums, so the parts never overflow the
    bar and two bars of the same scale line up.
    """
    scale = max(scale, 1)
    bar = Text()
    done = 0
    running = 0
    for count, char, style in parts:
        running += max(count, 0)
        edge = min(width, round(width * running / scale))
        if edge > done:
            bar.append(char * (edge - done), style=style)
            done = edge
    if done < width:
        bar.append("·" * (width - done), style="dim")
    return bar


def rollup_bar(row: dict[str, Any], width: int = BAR_WIDTH) -> Text:
    """Allocated, reserved and available out of the row's total (the rest is not allocatable)."""
    allocated, reserved, available = row["allocated"], row["reserved"], row["available"]
    scale = max(row["total"], allocated + reserved + available)
    return stacked_bar(
        [(allocated, "█", "red"), (reserved, "▓", "yellow"), (available, "░", "green")], scale, width
    )


def rollup_legend() -> Text:
    return Text.assemble(
        ("█", "red"),
        " allocated  ",
        ("▓", "yellow"),
        " reserved  ",
        ("░", "green"),
        " available  ",
        ("·", "dim"),
        " not allocatable (provisioning, unhealthy, maintenance, unreachable)",
    )


# --- Capacity ----------------------------------------------------------------------


def headline_row(pool: dict[str, Any]) -> dict[str, Any] | None:
    """The row a pool is sold by: `gpu`, or `gpu.mig` / `gpu.slot` in a fractional pool."""
    rows = pool.get("capacity") or []
    wanted = HEADLINE.get(pool.get("sharing") or "", "gpu")
    for resource in (wanted, "gpu"):
        row = next((r for r in rows if r["resource"] == resource), None)
        if row is not None:
            return row
    return None


# Hyphenated two-line headers, for a terminal too narrow for the whole words.
SHORT_HEADERS = {
    "allocatable": "alloc-\natable",
    "allocated": "allo-\ncated",
    "reserved": "reser-\nved",
    "available": "avail-\nable",
    "provisioning": "provi-\nsioning",
    "unhealthy": "un-\nhealthy",
    "maintenance": "mainte-\nnance",
    "unreachable": "unreach-\nable",
    "resource": "re-\nsource",
    "sharing": "shar-\ning",
}
MIN_BAR = 8
Rows = tuple[list[str], list[list[Any]]]


def _longest(cells: Iterable[Any]) -> int:
    """The widest line among the cells (str or Text)."""
    lines = (
        line for cell in cells for line in (cell.plain if isinstance(cell, Text) else str(cell)).split("\n")
    )
    return max((cell_len(line) for line in lines), default=0)


def _table(title: str, rows: Rows, right: set[str], *, boxed: bool, short: bool) -> Table:
    headers, cells = rows
    if boxed:
        table = Table(title=title, title_justify="left")
    else:
        table = Table(title=title, title_justify="left", box=None, collapse_padding=True, pad_edge=False)
    for index, header in enumerate(headers):
        table.add_column(
            SHORT_HEADERS.get(header, header) if short else header,
            justify="right" if header in right else "left",
            min_width=_longest(row[index] for row in cells) or None,
            no_wrap=True,
        )
    for row in cells:
        table.add_row(*row)
    return table


def _natural_width(out: Console, table: Table) -> int:
    return out.measure(table, options=out.options.update_width(10_000)).maximum


def print_whole_table(
    out: Console, title: str, make: Callable[[int | None], Rows], right: set[str], *, bars: bool = True
) -> None:
    """A table whose cells are never cut (ids are copied into the next command; numbers must read whole).

    `make(bar_width)` gives the headers and rows, with a bar column when `bar_width`
    is set. The first layout that fits the console with a bar of at least MIN_BAR
    cells wins: boxed with whole headers, boxed with hyphenated ones, borderless.
    When none fits, the last is printed at its own width and the terminal wraps
    its lines: a wrapped line still reads, a cut id does not.
    """
    layouts = ((True, False), (True, True), (False, True))
    for boxed, short in layouts:
        room = out.width - _natural_width(out, _table(title, make(None), right, boxed=boxed, short=short))
        if bars:
            room -= 3 if boxed else 1
        if room >= (MIN_BAR if bars else 0):
            break
    bar_width = max(MIN_BAR, min(BAR_WIDTH, room)) if bars else None
    table = _table(title, make(bar_width), right, boxed=boxed, short=short)
    natural = _natural_width(out, table)
    if natural <= out.width:
        out.print(table)
        return
    # `print(width=...)` never exceeds the console's width: widen the console for this one table.
    width = out.width
    out.width = natural
    try:
        out.print(table, crop=False)
    finally:
        out.width = width


def summary(out: Console, answer: dict[str, Any]) -> None:
    out.print(Text.assemble("Capacity for tenant ", (answer["tenantId"], "bold")))

    def make(bar_width: int | None) -> Rows:
        # The id under the name, whole: ids are copied into the next command.
        headers = ["pool / id", "model", "sharing", "resource", *COUNTS]
        rows: list[list[Any]] = []
        for pool in answer["pools"]:
            name = Text(pool["name"], style="bold")
            if pool.get("offered"):
                name.append(" (offered)", style="cyan")
            if pool.get("archived"):
                name.append(" (archived)", style="dim")
            name.append("\n" + pool["poolId"], style="dim")
            row = headline_row(pool)
            cells: list[Any] = [
                name,
                pool.get("gpuModel") or "other",
                pool.get("sharing") or "-",
                row["resource"] if row else "-",
                *([str(row[k]) for k in COUNTS] if row else ["-"] * len(COUNTS)),
            ]
            if bar_width:
                cells.append(rollup_bar(row, bar_width) if row else Text("-", style="dim"))
            rows.append(cells)
        if bar_width:
            headers.append("usage")
        return headers, rows

    print_whole_table(out, "Pools", make, set(COUNTS))
    out.print(rollup_legend())

    models = [[model, *(str(sums[k]) for k in COUNTS)] for model, sums in answer["byGpuModel"].items()]
    print_whole_table(
        out, "By GPU model (whole GPUs)", lambda _: (["model", *COUNTS], models), set(COUNTS), bars=False
    )
    if answer["pools"]:
        out.print(Text("Every resource of one pool: better-compute capacity --pool POOL", style="dim"))


def pool_rows(out: Console, answer: dict[str, Any], *, name: str | None = None) -> None:
    title = f"Pool {name} ({answer['poolId']})" if name else f"Pool {answer['poolId']}"

    def make(bar_width: int | None) -> Rows:
        headers = ["resource", *COUNTS, *BUCKETS]
        rows: list[list[Any]] = []
        for row in answer["rows"]:
            cells: list[Any] = [row["resource"], *(str(row[k]) for k in (*COUNTS, *BUCKETS))]
            if bar_width:
                cells.append(rollup_bar(row, bar_width))
            rows.append(cells)
        if bar_width:
            headers.append("usage")
        return headers, rows

    print_whole_table(out, title, make, {*COUNTS, *BUCKETS})
    if not answer["rows"]:
        out.print(Text("No capacity rows yet (the rollup has not counted this pool).", style="dim"))
        return
    out.print(rollup_legend())
    at_risk = answer.get("atRiskReservations")
    if at_risk:
        noun = "reservation is" if at_risk == 1 else "reservations are"
        out.print(
            Text(f"{at_risk} {noun} at risk in this pool (booked on nodes that left service)", style="red")
        )
    times = sorted({row["updatedAt"] for row in answer["rows"] if row.get("updatedAt") is not None})
    if times:
        counted = local_time(times[0])
        if len(times) > 1:
            counted += f" to {local_time(times[-1])}"
        out.print(Text(f"counted at {counted}", style="dim"))


def preview(out: Console, answer: dict[str, Any], *, asked: str, header: bool = True) -> None:
    fits = answer["fits"]
    if header:
        out.print(
            Text.assemble(
                ("fits: ", "bold"),
                ("yes", "bold green") if fits else ("no", "bold red"),
                f"   {asked}",
            )
        )
        out.print(f"start: {local_time(answer.get('start'))}   end: {local_time(answer.get('end'))}")
    reason = answer.get("reason")
    if reason:
        out.print(Text(f"reason: {reason.get('code')}: {reason.get('message')}"))
    preemptible = answer.get("preemptible")
    if preemptible:
        out.print(
            f"would give notice to {preemptible['count']} spot reservation(s); "
            f"it would start at {local_time(preemptible.get('startsAt'))}"
        )
    candidates = answer.get("candidates") or []
    if candidates:
        table = Table(title="Candidates, best first", title_justify="left")
        table.add_column("rank", justify="right")
        table.add_column("node", no_wrap=True, min_width=max(len(c["nodeId"]) for c in candidates))
        table.add_column("score", justify="right")
        table.add_column("atoms", justify="right")
        table.add_column("devices", overflow="fold")
        for rank, candidate in enumerate(candidates, start=1):
            table.add_row(
                str(rank),
                candidate["nodeId"],
                f"{candidate['score']:.2f}",
                str(len(candidate["atoms"])),
                ", ".join(candidate["atoms"]),
            )
        out.print(table)


def earliest(out: Console, answer: dict[str, Any], *, asked: str) -> None:
    """The earliest start, how far off it is, and the candidates there (or why nothing fits)."""
    fits = answer["fits"]
    searched = f"searched {local_time(answer.get('searchedFrom'))} to {local_time(answer.get('searchedTo'))}"
    out.print(
        Text.assemble(
            ("earliest: ", "bold"),
            (local_time(answer.get("start")), "bold green") if fits else ("none in the horizon", "bold red"),
            f"   {asked}",
        )
    )
    if fits:
        wait_ms = int(answer["start"]) - int(answer["searchedFrom"])
        wait = "at once" if wait_ms <= 0 else f"in {_span(wait_ms // 1000)}"
        out.print(f"starts {wait}, ends {local_time(answer.get('end'))}   ({searched})")
        preview(out, {**answer, "preemptible": None}, asked=asked, header=False)
        return
    out.print(searched)
    reason = answer.get("reason")
    if reason:
        out.print(Text(f"reason: {reason.get('code')}: {reason.get('message')}"))


def _span(seconds: int) -> str:
    """`3d 4h 5m` (down to minutes; seconds only under a minute)."""
    if seconds < 60:
        return f"{seconds}s"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    return " ".join(p for p in parts if p)


EXPLAIN_LABELS = {
    "scalars": "scalars do not fit",
    "selector": "too few atoms match",
    "noFreeAtoms": "too few free for the window",
    "topology": "topology (NVLink, gang label)",
}


def explain(out: Console, answer: dict[str, Any], *, asked: str) -> None:
    """Why not, as bars: the pool's nodes by the first filter that removes them, then sample reasons."""
    nodes = int(answer.get("nodes") or 0)
    removed = answer.get("removed") or {}
    rows: list[tuple[str, int, str]] = [
        (f"not schedulable: {bucket}", int(count), "yellow")
        for bucket, count in sorted((removed.get("notSchedulable") or {}).items())
    ]
    rows += [(label, int(removed.get(key) or 0), "red") for key, label in EXPLAIN_LABELS.items()]
    rows.append(("fit", int(answer.get("fit") or 0), "green"))
    out.print(Text.assemble(("why not: ", "bold"), f"{asked}   ({nodes} node(s) looked at)"))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("filter", no_wrap=True)
    table.add_column("nodes", justify="right")
    table.add_column("bar", no_wrap=True)
    width = 40
    for label, count, style in rows:
        length = round(width * count / nodes) if nodes else 0
        table.add_row(label, str(count), Text("█" * max(length, 1 if count else 0), style=style))
    out.print(table)
    samples = answer.get("samples") or {}
    if samples:
        reasons = Table(title="Sample nodes and why", title_justify="left")
        reasons.add_column("filter", no_wrap=True)
        reasons.add_column("node", no_wrap=True)
        reasons.add_column("reason", overflow="fold")
        for key, items in samples.items():
            for item in items:
                reasons.add_row(key, item["nodeId"], item["reason"])
        out.print(reasons)


# --- Reservations ------------------------------------------------------------------

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


# --- Timeline ----------------------------------------------------------------------


def timeline(out: Console, answer: dict[str, Any]) -> None:
    """One line per bucket: its start, a bar of booked (█) then free (░) GPUs, and the two counts."""
    buckets: list[dict[str, Any]] = answer["buckets"]
    allocatable = int(answer["allocatable"])
    step = answer["stepMinutes"]
    out.print(
        Text.assemble(
            ("Timeline of ", "bold"),
            (answer["poolId"], "bold"),
            f": {len(buckets)} bucket(s) of {step} min, {local_time(answer['from'], timespec='minutes')}"
            f" → {local_time(answer['to'], timespec='minutes')}",
        )
    )
    out.print(f"allocatable now: {allocatable} whole GPU(s); times in {zone_name(answer['from'])}")
    if not buckets:
        out.print("No buckets.")
        return
    label_width = len(short_local_time(buckets[0]["start"]))
    digits = max(len(str(allocatable)), *(len(str(b["booked"])) for b in buckets))
    numbers_width = len(f"  {'':>{digits}} booked  {'':>{digits}} free")
    width = max(10, min(60, out.width - label_width - numbers_width - 4))
    scale = max(allocatable, *(b["booked"] for b in buckets), 1)
    out.print(
        Text.assemble(
            " " * (label_width + 2),
            ("█", "red"),
            " booked  ",
            ("░", "green"),
            " free",
            f"   (full bar = {scale} GPU(s))",
        )
    )
    for bucket in buckets:
        booked, free = bucket["booked"], bucket["free"]
        line = Text(short_local_time(bucket["start"]) + " │")
        line.append_text(stacked_bar([(booked, "█", "red"), (free, "░", "green")], scale, width))
        line.append(f"│  {booked:>{digits}} booked  {free:>{digits}} free")
        out.print(line, no_wrap=True, overflow="ignore")
    peak = max(buckets, key=lambda b: b["booked"])
    out.print(
        f"peak: {peak['booked']} booked at {local_time(peak['start'], timespec='minutes')}; "
        f"least free: {min(b['free'] for b in buckets)}"
    )


# --- Errors ------------------------------------------------------------------------


def error_lines(code: str, message: str, details: list[Any]) -> list[str]:
    """`error: CODE: message` and one line per detail, as the API sent them."""
    lines = [f"error: {code}: {message}"]
    for detail in details:
        if isinstance(detail, dict) and "message" in detail:
            text = str(detail["message"])
            if detail.get("code"):
                text = f"{detail['code']}: {text}"
            field = detail.get("field")
            lines.append(f"  {field}: {text}" if field else f"  {text}")
        elif isinstance(detail, dict):
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in detail.items()))
        else:
            lines.append(f"  {detail}")
    return lines
