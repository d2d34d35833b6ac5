"""Human output of the placer's answers: would it fit now (preview), when (earliest), why not (explain)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from better_compute.render import local_time


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
