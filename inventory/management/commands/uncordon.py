"""`uncordon NODE [--reason R]`: let a node take new placements again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from inventory.management.commands.cordon import cli_actor
from inventory.operations import node_uncordon
from inventory.selectors import node_find


class Command(BaseCommand):
    help = "Uncordon a node."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node id or hostname")
        parser.add_argument("--reason", default="")
        parser.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = node_find(ref=options["node"])
            was = node.cordoned
            node = node_uncordon(node=node, reason=options["reason"], actor=cli_actor(options["actor"]))
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if not was:
            self.stdout.write(f"{node.hostname} ({node.pk}) was not cordoned")
        else:
            self.stdout.write(self.style.SUCCESS(f"{node.hostname} ({node.pk}) uncordoned"))
