"""Human output: the pieces every drawing shares: the console, local times, bars, whole tables, errors.

Every function takes the API's answer as it came and prints it; nothing here
changes what a command does. The bars use a different character per part, so
they still read without colour (in a pipe, or with NO_COLOR):
`█` allocated or booked, `▓` reserved, `░` available or free, `·` not allocatable.
The drawings of each answer are in `render_capacity` (the capacity reads),
`render_placement` (preview, earliest, explain) and `render_reservations`.
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


# --- Whole tables ------------------------------------------------------------------


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
