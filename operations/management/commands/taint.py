"""`taint NODE KEY --effect NoSchedule [--value V] [--reason R]`: add or replace a taint."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from inventory.models import Node, TaintEffect
from operations.management.commands._node_command import NodeCommand
from operations.services import node_taint


class Command(NodeCommand):
    help = "Taint a node; a NoSchedule taint makes it unschedulable."
    changed = "tainted {key}={value}:{effect} ({node.noschedule_taints} NoSchedule)"

    def add_action_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key")
        parser.add_argument("--value", default="")
        parser.add_argument("--effect", required=True, choices=TaintEffect.values)

    def act(self, node: Node, options: dict[str, Any], *, actor: str) -> Node:
        return node_taint(
            node=node,
            key=options["key"],
            value=options["value"],
            effect=options["effect"],
            reason=options["reason"],
            actor=actor,
        )
