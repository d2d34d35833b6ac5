"""`taint NODE KEY --effect NoSchedule [--value V] [--reason R]`: add or replace a taint."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from inventory.management.commands.cordon import cli_actor
from inventory.models import TaintEffect
from inventory.operations import node_taint
from inventory.selectors import node_find


class Command(BaseCommand):
    help = "Taint a node; a NoSchedule taint makes it unschedulable."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node id or hostname")
        parser.add_argument("key")
        parser.add_argument("--value", default="")
        parser.add_argument("--effect", required=True, choices=TaintEffect.values)
        parser.add_argument("--reason", default="")
        parser.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = node_find(ref=options["node"])
            node = node_taint(
                node=node,
                key=options["key"],
                value=options["value"],
                effect=options["effect"],
                reason=options["reason"],
                actor=cli_actor(options["actor"]),
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"{node.hostname} ({node.pk}) tainted {options['key']}={options['value']}:{options['effect']}"
                f" ({node.noschedule_taints} NoSchedule)"
            )
        )
