"""Human output of the capacity reads: the pools' summary, one pool's rows, and a pool's timeline."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from better_compute.render import (
    Rows,
    local_time,
    print_whole_table,
    rollup_bar,
    rollup_legend,
    short_local_time,
    stacked_bar,
    zone_name,
)

COUNTS = ("total", "allocatable", "allocated", "reserved", "available")
BUCKETS = ("provisioning", "unhealthy", "maintenance", "unreachable")
# The resource that headlines a pool of each sharing mode: the device class it sells (else `gpu`).
HEADLINE = {"mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot"}


def headline_row(pool: dict[str, Any]) -> dict[str, Any] | None:
    """The row a pool is sold by: `gpu`, or `gpu.mig` / `gpu.slot` in a fractional pool."""
    rows = pool.get("capacity") or []
    wanted = HEADLINE.get(pool.get("sharing") or "", "gpu")
    for resource in (wanted, "gpu"):
        row = next((r for r in rows if r["resource"] == resource), None)
        if row is not None:
            return row
    return None


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
