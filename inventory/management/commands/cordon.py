"""`cordon NODE --reason R`: stop new placements on a node (by id or hostname)."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from inventory.operations import node_cordon
from inventory.selectors import node_find


def cli_actor(given: str | None) -> str:
    """The audit trail's actor for a command run: `--actor`, else the shell user."""
    return given or f"cli:{getpass.getuser()}"


class Command(BaseCommand):
    help = "Cordon a node: existing bookings stay, new placements stop."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node id or hostname")
        parser.add_argument("--reason", required=True)
        parser.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = node_find(ref=options["node"])
            was = node.cordoned
            node = node_cordon(node=node, reason=options["reason"], actor=cli_actor(options["actor"]))
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        if was:
            self.stdout.write(f"{node.hostname} ({node.pk}) was already cordoned: {node.cordon_reason}")
        else:
            self.stdout.write(self.style.SUCCESS(f"{node.hostname} ({node.pk}) cordoned"))
