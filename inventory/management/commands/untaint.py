"""`untaint NODE KEY [--reason R]`: remove a taint."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from inventory.management.commands.cordon import cli_actor
from inventory.models import Taint
from inventory.operations import node_untaint
from inventory.selectors import node_find


class Command(BaseCommand):
    help = "Remove a taint from a node."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node id or hostname")
        parser.add_argument("key")
        parser.add_argument("--reason", default="")
        parser.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = node_find(ref=options["node"])
            had = Taint.objects.filter(node=node, key=options["key"]).exists()
            node = node_untaint(
                node=node, key=options["key"], reason=options["reason"], actor=cli_actor(options["actor"])
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if not had:
            self.stdout.write(f"{node.hostname} ({node.pk}) has no taint {options['key']!r}")
        else:
            self.stdout.write(self.style.SUCCESS(f"{node.hostname} ({node.pk}) untainted {options['key']}"))
