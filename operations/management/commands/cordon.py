"""`cordon NODE --reason R`: stop new placements on a node (by id or hostname)."""

from __future__ import annotations

from typing import Any

from inventory.models import Node
from operations.management.commands._node_command import NodeCommand
from operations.services import node_cordon


class Command(NodeCommand):
    help = "Cordon a node: existing bookings stay, new placements stop."
    reason_required = True
    changed = "cordoned"
    unchanged = "was already cordoned: {node.cordon_reason}"

    def will_change(self, node: Node, options: dict[str, Any]) -> bool:
        return not node.cordoned

    def act(self, node: Node, options: dict[str, Any], *, actor: str) -> Node:
        return node_cordon(node=node, reason=options["reason"], actor=actor)
