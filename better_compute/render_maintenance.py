"""Human output of maintenance windows: the dry run, a scheduled window, the list.

The dry run reads as an operator weighs it: per node a tree of the three groups
(running ones that would have to end, future ones BookingRepair would move and
where to, those that cannot move), the counts per tenant, and per pool the
lowest `available` during the window with and without the nodes, as two bars
on one scale so the drop is seen at a glance.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from better_compute.render import local_time, print_whole_table, stacked_bar, zone_name

GROUPS = (
    ("running", "running: would have to end", "red"),
    ("moved", "moved: BookingRepair moves them", "yellow"),
    ("stuck", "stuck: cannot move, marked at risk", "red"),
)
STATE_STYLES = {"scheduled": "cyan", "active": "yellow", "ended": "dim", "cancelled": "dim"}


def _span(start: int, end: int) -> str:
    return f"{local_time(start)} to {local_time(end)}"


def _reservation_line(group: str, r: dict[str, Any]) -> Text:
    line = Text(f"{r['reservationId']}  tenant {r['tenantId']}  {_span(r['startsAt'], r['endsAt'])}")
    if group == "moved" and r.get("toNodeIds"):
        line.append(f"  → {', '.join(r['toNodeIds'])}", style="yellow")
    if group != "moved" and r.get("reason"):
        line.append(f"  ({r['reason']})", style="dim")
    return line


def node_trees(out: Console, nodes: list[dict[str, Any]]) -> None:
    """One tree per node: its three groups, each with its reservations (or `none`)."""
    for node in nodes:
        touched = sum(len(node[g]) for g, _, _ in GROUPS)
        label = Text.assemble((node.get("hostname") or node["nodeId"], "bold"), f" ({node['nodeId']})")
        label.append(f"  {touched} reservation(s)" if touched else "  nothing booked in the window", "dim")
        tree = Tree(label)
        for group, words, style in GROUPS:
            items = node[group]
            branch = tree.add(Text(f"{words} ({len(items)})", style=style if items else "dim"))
            for r in items:
                branch.add(_reservation_line(group, r))
        out.print(tree)


def tenant_counts(out: Console, tenants: list[dict[str, Any]]) -> None:
    if not tenants:
        out.print("No tenant's reservation is touched.")
        return
    rows = [[t["tenantId"], str(t["running"]), str(t["moved"]), str(t["stuck"])] for t in tenants]
    print_whole_table(
        out,
        "Per tenant",
        lambda _: (["tenant", "running", "moved", "stuck"], rows),
        {"running", "moved", "stuck"},
        bars=False,
    )


def _with_without(with_nodes: int, without: int, scale: int, width: int) -> Text:
    bar = Text("with    ")
    bar.append_text(stacked_bar([(with_nodes, "░", "green")], scale, width))
    bar.append("\nwithout ")
    bar.append_text(stacked_bar([(without, "░", "yellow")], scale, width))
    return bar


def pool_lowest(out: Console, pools: list[dict[str, Any]]) -> None:
    """Per pool and resource: the lowest `available` in the window, with the nodes and without them."""
    if not pools:
        return
    scale = max(max(p["lowestAvailable"], p["lowestAvailableWithout"]) for p in pools)

    def make(bar_width: int | None) -> tuple[list[str], list[list[Any]]]:
        headers = ["pool", "resource", "with", "without", "drop"]
        rows: list[list[Any]] = []
        for p in pools:
            with_nodes, without = p["lowestAvailable"], p["lowestAvailableWithout"]
            row: list[Any] = [p["poolId"], p["resource"], str(with_nodes), str(without)]
            row.append(str(with_nodes - without))
            if bar_width is not None:
                row.append(_with_without(with_nodes, without, scale, bar_width))
            rows.append(row)
        return ([*headers, "lowest available"] if bar_width is not None else headers), rows

    print_whole_table(out, "Lowest available during the window", make, {"with", "without", "drop"})


def plan(out: Console, answer: dict[str, Any]) -> None:
    """`nodes/planMaintenance`: nothing was written; what scheduling the window would do."""
    nodes, tenants = answer["nodes"], answer["tenants"]
    out.print(
        Text.assemble(
            ("Maintenance plan (dry run, nothing written): ", "bold"),
            f"{len(nodes)} node(s) from {_span(answer['from'], answer['to'])}",
        )
    )
    out.print(Text(f"times in {zone_name(answer['from'])}", style="dim"))
    _totals(out, tenants)
    node_trees(out, nodes)
    tenant_counts(out, tenants)
    pool_lowest(out, answer.get("pools") or [])


def _totals(out: Console, tenants: list[dict[str, Any]]) -> None:
    totals = {g: sum(t[g] for t in tenants) for g, _, _ in GROUPS}
    out.print(f"running {totals['running']} · moved {totals['moved']} · stuck {totals['stuck']}")


def window(out: Console, w: dict[str, Any], *, title: str) -> None:
    out.print(
        Text.assemble(
            (f"{title} {w['id']}", "bold"),
            f" {w['reason']!r} ",
            (w["state"], STATE_STYLES.get(w["state"], "")),
        )
    )
    out.print(f"from {_span(w['from'], w['to'])}")
    out.print(f"nodes: {', '.join(w['nodeIds'])}")


def scheduled(out: Console, answer: dict[str, Any]) -> None:
    """`nodes/scheduleMaintenance`: the window, and what became of the reservations inside it."""
    window(out, answer["window"], title="Scheduled window")
    _totals(out, answer["tenants"])
    node_trees(out, answer["nodes"])
    tenant_counts(out, answer["tenants"])


def window_list(out: Console, windows: list[dict[str, Any]]) -> None:
    if not windows:
        out.print("No maintenance window.")
        return
    rows = [
        [
            w["id"],
            w["reason"],
            Text(w["state"], style=STATE_STYLES.get(w["state"], "")),
            local_time(w["from"]),
            local_time(w["to"]),
            "\n".join(w["nodeIds"]),
        ]
        for w in windows
    ]
    print_whole_table(
        out,
        "Maintenance windows",
        lambda _: (["window", "reason", "state", "from", "to", "nodes"], rows),
        set(),
        bars=False,
    )
