"""`better-compute maintenance plan|schedule|list|update|cancel`: maintenance windows, for operators.

Each action is one `nodes/*Maintenance` method, sent as the token's principal
(an operator's token; no tenant is needed or sent). `plan` is the dry run:
nothing is written, and its numbers are what `schedule` then does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol

from better_compute import render, render_maintenance
from better_compute.arguments import UsageError, parse_time, positive_int
from better_compute.client import Client
from better_compute.config import Settings


class Context(Protocol):
    """What the actions use of `cli.Context` (declared here, so that `cli` alone imports this module)."""

    args: argparse.Namespace
    settings: Settings
    tenant: str
    client: Client
    as_json: bool

    def print_json(self, answer: Any) -> None: ...

    def pool(self, text: str, *, need_sharing: bool = False) -> tuple[str, dict[str, Any] | None]: ...


# Adds one command: its name, its help, and the function that runs it (`cli.build_parser`).
AddCommand = Callable[[str, str, Callable[..., int]], argparse.ArgumentParser]

EXIT_OK = 0


def _node_ids(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("name at least one node id (node_…), comma-separated")
    return ids


def _labels(text: str) -> dict[str, str]:
    """`rack=r01,fabric=ib-east-1`: the pool's nodes whose labels hold every pair."""
    labels: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        if not part or not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{part!r}: a selector is key=value pairs, comma-separated")
        labels[key.strip()] = value.strip()
    return labels


def add_commands(command: AddCommand, common: Callable[..., None]) -> None:
    """`maintenance` and its actions; each action gets the connection flags again, as every command."""
    parent = command("maintenance", "Maintenance windows on nodes, for platform operators.", _no_action)
    actions = parent.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str, handler: Callable[[Context], int]) -> argparse.ArgumentParser:
        sub = actions.add_parser(
            name, help=help_text, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        common(sub, top=False)
        sub.set_defaults(handler=handler, needs_tenant=False)
        return sub

    plan = action(
        "plan",
        "What a window would do, without doing it (nodes/planMaintenance): per node the reservations "
        "that would end, move or be stuck, counts per tenant, the pool's lowest available with and without.",
        cmd_plan,
    )
    plan.add_argument("--nodes", type=_node_ids, help="node ids, comma-separated")
    plan.add_argument("--pool", help="instead of --nodes: the pool's nodes (pool_… or a name)")
    plan.add_argument("--selector", type=_labels, help="with --pool: labels every node holds, k=v,k=v")
    _span(plan)
    plan.add_argument("--reason", help="the window's name (default: maintenance)")

    schedule = action("schedule", "Book a maintenance window (nodes/scheduleMaintenance).", cmd_schedule)
    schedule.add_argument("--nodes", type=_node_ids, required=True, help="node ids, comma-separated")
    _span(schedule)
    schedule.add_argument("--reason", required=True, help="the window's name, e.g. firmware")

    listing = action("list", "Maintenance windows by start (nodes/listMaintenance).", cmd_list)
    listing.add_argument("--pool", help="only windows on this pool's nodes (pool_…)")
    listing.add_argument("--node", help="only windows on this node (node_…)")
    listing.add_argument("--all", action="store_true", help="also ended and cancelled windows")
    listing.add_argument("--limit", type=positive_int, help="at most this many (1-500; default 100)")

    update = action("update", "Shorten or extend a window (nodes/updateMaintenance).", cmd_update)
    update.add_argument("window_id", metavar="WINDOW_ID", help="the window id (mw_…)")
    update.add_argument("--to", dest="end", type=parse_time, required=True, help="the new end")

    cancel = action("cancel", "Cancel a window (nodes/cancelMaintenance).", cmd_cancel)
    cancel.add_argument("window_id", metavar="WINDOW_ID", help="the window id (mw_…)")
    cancel.add_argument("--reason", default="", help="why, for the audit trail")


def _span(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from", dest="start", type=parse_time, required=True, help="ISO-8601, epoch ms or now"
    )
    parser.add_argument("--to", dest="end", type=parse_time, required=True, help="ISO-8601, epoch ms or now")


def _no_action(ctx: Context) -> int:  # pragma: no cover - argparse requires an action first
    raise UsageError("name an action: plan, schedule, list, update or cancel")


def _answer(ctx: Context, answer: dict[str, Any], draw: Callable[[Any, Any], None]) -> int:
    if ctx.as_json:
        ctx.print_json(answer)
    else:
        draw(render.console(), answer)
    return EXIT_OK


def cmd_plan(ctx: Context) -> int:
    args = ctx.args
    if bool(args.nodes) == bool(args.pool):
        raise UsageError("give --nodes, or --pool (with an optional --selector)")
    if args.selector and not args.pool:
        raise UsageError("--selector goes with --pool")
    body: dict[str, Any] = {"from": args.start, "to": args.end}
    if args.nodes:
        body["nodeIds"] = args.nodes
    else:
        if not args.pool.startswith("pool_"):
            # A name is looked up among the pools a tenant sees (capacity/summary).
            if not ctx.settings.tenant:
                raise UsageError("--pool by name needs --tenant to look it up; or give the pool id")
            ctx.tenant = ctx.settings.tenant
        body["poolId"] = ctx.pool(args.pool)[0]
        if args.selector:
            body["selector"] = args.selector
    if args.reason:
        body["reason"] = args.reason
    return _answer(ctx, ctx.client.call("nodes/planMaintenance", body), render_maintenance.plan)


def cmd_schedule(ctx: Context) -> int:
    args = ctx.args
    body = {"nodeIds": args.nodes, "from": args.start, "to": args.end, "reason": args.reason}
    return _answer(ctx, ctx.client.call("nodes/scheduleMaintenance", body), render_maintenance.scheduled)


def cmd_list(ctx: Context) -> int:
    args = ctx.args
    body: dict[str, Any] = {"includeEnded": bool(args.all)}
    if args.pool:
        body["poolId"] = args.pool
    if args.node:
        body["nodeId"] = args.node
    if args.limit is not None:
        body["limit"] = args.limit
    answer = ctx.client.call("nodes/listMaintenance", body)
    return _answer(ctx, answer, lambda out, a: render_maintenance.window_list(out, a["windows"]))


def cmd_update(ctx: Context) -> int:
    body = {"windowId": ctx.args.window_id, "to": ctx.args.end}
    answer = ctx.client.call("nodes/updateMaintenance", body)
    return _answer(ctx, answer, lambda out, w: render_maintenance.window(out, w, title="Updated window"))


def cmd_cancel(ctx: Context) -> int:
    body = {"windowId": ctx.args.window_id, "reason": ctx.args.reason}
    answer = ctx.client.call("nodes/cancelMaintenance", body)
    return _answer(ctx, answer, lambda out, w: render_maintenance.window(out, w, title="Cancelled window"))
