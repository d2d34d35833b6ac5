"""`uncordon NODE [--reason R]`: let a node take new placements again."""

from __future__ import annotations

from typing import Any

from inventory.models import Node
from operations.management.commands._node_command import NodeCommand
from operations.services import node_uncordon


class Command(NodeCommand):
    help = "Uncordon a node."
    changed = "uncordoned"
    unchanged = "was not cordoned"

    def will_change(self, node: Node, options: dict[str, Any]) -> bool:
        return node.cordoned

    def act(self, node: Node, options: dict[str, Any], *, actor: str) -> Node:
        return node_uncordon(node=node, reason=options["reason"], actor=actor)
