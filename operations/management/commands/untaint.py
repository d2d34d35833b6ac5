"""`untaint NODE KEY [--reason R]`: remove a taint."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from inventory.models import Node, Taint
from operations.management.commands._node_command import NodeCommand
from operations.services import node_untaint


class Command(NodeCommand):
    help = "Remove a taint from a node."
    changed = "untainted {key}"
    unchanged = "has no taint {key!r}"

    def add_action_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key")

    def will_change(self, node: Node, options: dict[str, Any]) -> bool:
        return Taint.objects.filter(node=node, key=options["key"]).exists()

    def act(self, node: Node, options: dict[str, Any], *, actor: str) -> Node:
        return node_untaint(node=node, key=options["key"], reason=options["reason"], actor=actor)
