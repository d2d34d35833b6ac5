"""The shape of the node commands (`cordon`, `uncordon`, `taint`, `untaint`).

Each is one `operations.services` node action on one node, named by id or
hostname, with `--reason` and `--actor` for the audit trail. The leading
underscore keeps this module out of `manage.py help`.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from inventory.models import Node
from inventory.selectors import node_find


def cli_actor(given: str | None) -> str:
    """The audit trail's actor for a command run: `--actor`, else the shell user."""
    return given or f"cli:{getpass.getuser()}"


class NodeCommand(BaseCommand):
    """Find the node, read whether the action will change it, call the service, say what happened.

    A subclass adds its own arguments (`add_action_arguments`), calls its
    service (`act`), and words the outcome after the node's name: `changed`, or
    `unchanged` when `will_change` tells beforehand that the action is already
    in effect. Both are `str.format` templates over the options and the node
    as the service answers it (`{key}`, `{node.cordon_reason}`).
    """

    reason_required = False
    changed = ""
    unchanged = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node id or hostname")
        self.add_action_arguments(parser)
        if self.reason_required:
            parser.add_argument("--reason", required=True)
        else:
            parser.add_argument("--reason", default="")
        parser.add_argument("--actor", help="who, for the audit trail (default: cli:<user>)")

    def add_action_arguments(self, parser: CommandParser) -> None:
        """The action's own arguments, between the node and `--reason`."""

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            node = node_find(ref=options["node"])
            will_change = self.will_change(node, options)
            node = self.act(node, options, actor=cli_actor(options["actor"]))
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        words = {**options, "node": node}
        subject = f"{node.hostname} ({node.pk})"
        if will_change:
            self.stdout.write(self.style.SUCCESS(f"{subject} {self.changed.format_map(words)}"))
        else:
            self.stdout.write(f"{subject} {self.unchanged.format_map(words)}")

    def will_change(self, node: Node, options: dict[str, Any]) -> bool:
        """Whether the action will change the node, read before it runs."""
        return True

    def act(self, node: Node, options: dict[str, Any], *, actor: str) -> Node:
        """Call the service; answer the node as it is after."""
        raise NotImplementedError
