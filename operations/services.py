"""The operator's node actions: each one the inventory's guarded row write inside `nodes_changing`.

The admin consoles, the API and the commands all call these, so an action moves
the pool's counts, wakes waiting creates and asks for repairs the same way
from every door. Each owns its transaction, so each runs again from the start
when PostgreSQL picks it as a deadlock's victim (`core.retry`): the
inventory's own retry stands down inside this transaction.
"""

from __future__ import annotations

from django.db import transaction

from core.retry import deadlock_retried
from inventory.models import Device, Node, NodeResource
from inventory.services import nodes as node_rows
from reservations.nodes.changes import nodes_changing


@deadlock_retried
def node_resource_save(*, resource: NodeResource, actor: str) -> NodeResource:
    """Save a scalar's capacity and ratio; the pool's scalar rollups move in the same transaction."""
    with transaction.atomic(), nodes_changing([resource.node_id]):
        return node_rows.node_resource_save(resource=resource, actor=actor)


@deadlock_retried
def node_cordon(*, node: Node, reason: str, actor: str) -> Node:
    """Cordon the node; its atoms move to `maintenance` in the same transaction."""
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_cordon(node=node, reason=reason, actor=actor)


@deadlock_retried
def node_uncordon(*, node: Node, actor: str, reason: str = "") -> Node:
    """Uncordon the node; its atoms count again at once and waiting creates retry."""
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_uncordon(node=node, actor=actor, reason=reason)


@deadlock_retried
def node_set_maintenance(*, node: Node, on: bool, reason: str, actor: str) -> Node:
    """Put the node in (or take it out of) maintenance, moving its atoms with it."""
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_set_maintenance(node=node, on=on, reason=reason, actor=actor)


@deadlock_retried
def node_taint(*, node: Node, key: str, value: str, effect: str, reason: str, actor: str) -> Node:
    """Add or replace a taint; a NoSchedule one moves the node's atoms to `unhealthy` at once."""
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_taint(
            node=node, key=key, value=value, effect=effect, reason=reason, actor=actor
        )


@deadlock_retried
def node_untaint(*, node: Node, key: str, actor: str, reason: str = "") -> Node:
    """Remove a taint; the node's atoms count again if nothing else keeps them out."""
    with transaction.atomic(), nodes_changing([node.pk]):
        return node_rows.node_untaint(node=node, key=key, actor=actor, reason=reason)


@deadlock_retried
def device_set_health(*, device: Device, healthy: bool, reason: str, actor: str) -> Device:
    """Mark a device (and a partitioned GPU's atoms) healthy or unhealthy, moving them between counts."""
    with transaction.atomic(), nodes_changing([device.node_id]):
        return node_rows.device_set_health(device=device, healthy=healthy, reason=reason, actor=actor)
