"""`maintenance plan|schedule|list|update|cancel`: maintenance windows from the operator's shell.

The same services and selectors as `nodes/*Maintenance` (`reservations.maintenance`),
so a window booked here is audited, repaired and switched by the worker as one
booked over HTTP. Nodes are named by id or hostname, comma-separated; times are
ISO-8601 (a naive time is in the server's TIME_ZONE) or epoch milliseconds. The
drawing is plain text, one line per fact, for a terminal or a log.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from core.errors import DomainError
from inventory.selectors import node_find
from operations.management.commands._node_command import cli_actor
from reservations.maintenance import selectors, services
from reservations.maintenance.selectors import MaintenancePlan, NodeImpact
from reservations.models import MaintenanceWindow

GROUPS = (
    ("running", "running, would have to end"),
    ("moved", "moved by BookingRepair"),
    ("stuck", "stuck, marked at risk"),
)


def parse_instant(text: str) -> datetime:
    """ISO-8601 (naive: the server's TIME_ZONE) or epoch milliseconds, as an aware datetime."""
    value = text.strip()
    if re.fullmatch(r"[0-9]{13}", value):
        return datetime.fromtimestamp(int(value) / 1000, tz=UTC)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{text!r} is neither ISO-8601 nor epoch milliseconds") from None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def _labels(text: str) -> dict[str, str]:
    pairs = [part.partition("=") for part in text.split(",") if part.strip()]
    if not pairs or any(not sep or not key.strip() for key, sep, _ in pairs):
        raise CommandError(f"--label {text!r}: give key=value pairs, comma-separated")
    return {key.strip(): value.strip() for key, _, value in pairs}


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_lines(plan: MaintenancePlan, *, pools: bool = True) -> list[str]:
    """The dry run (or a scheduled window's outcome) as plain lines: per node, per tenant, per pool."""
    lines = [
        f"window {_stamp(plan.starts_at)} to {_stamp(plan.ends_at)}, {len(plan.nodes)} node(s)",
        "reservations: " + ", ".join(f"{plan.count(g)} {g}" for g, _ in GROUPS),
    ]
    for node in plan.nodes:
        lines.extend(_node_lines(node))
    if plan.tenants:
        lines.append("per tenant (running / moved / stuck):")
        lines.extend(f"  {t.tenant_id}: {t.running} / {t.moved} / {t.stuck}" for t in plan.tenants)
    if pools:
        lines.append("lowest available during the window (with the nodes -> without them):")
        lines.extend(f"  {p.pool_id} {p.resource}: {p.with_nodes} -> {p.without_nodes}" for p in plan.pools)
    return lines


def _node_lines(node: NodeImpact) -> list[str]:
    lines = [f"{node.hostname} ({node.node_id})"]
    for group, words in GROUPS:
        items = getattr(node, group)
        lines.append(f"  {words}: {len(items)}")
        for r in items:
            where = f" -> {', '.join(r.to_node_ids)}" if r.to_node_ids else ""
            why = f" ({r.reason})" if group != "moved" and r.reason else ""
            lines.append(
                f"    {r.reservation_id} tenant {r.tenant_id}"
                f" {_stamp(r.starts_at)} to {_stamp(r.ends_at)}{where}{why}"
            )
    return lines


def window_line(window: MaintenanceWindow) -> str:
    nodes = ",".join(sorted(m.node_id for m in window.members.all()))
    return (
        f"{window.pk} {window.state} {window.reason!r}"
        f" {_stamp(window.starts_at)} to {_stamp(window.ends_at)} nodes {nodes}"
    )


class Command(BaseCommand):
    help = "Maintenance windows: plan (dry run), schedule, list, update (shorten or extend), cancel."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        plan = actions.add_parser("plan", help="what a window would do, writing nothing")
        plan.add_argument("--nodes", help="node ids or hostnames, comma-separated")
        plan.add_argument("--pool", help="instead of --nodes: the pool's nodes (pool id)")
        plan.add_argument("--label", help="with --pool: labels each node holds, key=value,key=value")
        schedule = actions.add_parser("schedule", help="book a window")
        schedule.add_argument("--nodes", required=True, help="node ids or hostnames, comma-separated")
        schedule.add_argument("--reason", required=True, help="the window's name")
        for sub in (plan, schedule):
            sub.add_argument("--from", dest="start", required=True, help="ISO-8601 or epoch ms")
            sub.add_argument("--to", dest="end", required=True, help="ISO-8601 or epoch ms")
        listing = actions.add_parser("list", help="windows by start")
        listing.add_argument("--pool")
        listing.add_argument("--node", help="node id or hostname")
        listing.add_argument("--all", action="store_true", help="also ended and cancelled windows")
        update = actions.add_parser("update", help="a new end: earlier shortens, later extends")
        update.add_argument("window")
        update.add_argument("--to", dest="end", required=True)
        cancel = actions.add_parser("cancel", help="call a window off")
        cancel.add_argument("window")
        cancel.add_argument("--reason", default="")
        for sub in (plan, schedule, update, cancel):
            sub.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            lines = getattr(self, f"_{options['action']}")(options)
        except DomainError as exc:
            details = "".join(f"\n  {d.get('field', '')}: {d.get('message', '')}" for d in exc.details)
            raise CommandError(f"{exc.code}: {exc.message}{details}") from exc
        self.stdout.write("\n".join(lines))

    def _node_ids(self, text: str) -> list[str]:
        return [node_find(ref=ref.strip()).pk for ref in text.split(",") if ref.strip()]

    def _plan(self, options: dict[str, Any]) -> list[str]:
        if bool(options["nodes"]) == bool(options["pool"]):
            raise CommandError("give --nodes, or --pool (with an optional --label)")
        node_ids = selectors.maintenance_nodes_resolve(
            node_ids=self._node_ids(options["nodes"]) if options["nodes"] else None,
            pool_id=options["pool"],
            labels=_labels(options["label"]) if options["label"] else None,
        )
        plan = selectors.maintenance_plan(
            node_ids=node_ids,
            starts_at=parse_instant(options["start"]),
            ends_at=parse_instant(options["end"]),
            actor=cli_actor(options["actor"]),
        )
        return ["dry run: nothing written", *plan_lines(plan)]

    def _schedule(self, options: dict[str, Any]) -> list[str]:
        impact = services.maintenance_schedule(
            node_ids=self._node_ids(options["nodes"]),
            starts_at=parse_instant(options["start"]),
            ends_at=parse_instant(options["end"]),
            reason=options["reason"],
            actor=cli_actor(options["actor"]),
        )
        plan = selectors.impact_plan(impact)
        return [f"scheduled {window_line(impact.window)}", *plan_lines(plan, pools=False)]

    def _list(self, options: dict[str, Any]) -> list[str]:
        node_id = node_find(ref=options["node"]).pk if options["node"] else None
        windows = selectors.maintenance_list(
            pool_id=options["pool"], node_id=node_id, live=not options["all"]
        )
        return [window_line(w) for w in windows] or ["no maintenance window"]

    def _update(self, options: dict[str, Any]) -> list[str]:
        window = services.maintenance_update(
            window_id=options["window"],
            ends_at=parse_instant(options["end"]),
            actor=cli_actor(options["actor"]),
        )
        return [f"updated {window_line(window)}"]

    def _cancel(self, options: dict[str, Any]) -> list[str]:
        window = services.maintenance_cancel(
            window_id=options["window"], actor=cli_actor(options["actor"]), reason=options["reason"]
        )
        return [f"cancelled {window_line(window)}"]
