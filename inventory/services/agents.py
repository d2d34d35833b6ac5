"""A node's own agent: it registers its host once and keeps it alive between reports.

`node_agent_register` gives the agent its node: the same node every time for the
same hostname, made on the first call as `discovered` (the `provisioning` bucket),
so it is never scheduled before its first report says what it has. The node is
marked `agent`, which moves its assignments from the stand-in daemon to the
agent (`reservations.delivery.agent`). `node_heartbeat` is the cheap proof of
life between reports: one UPDATE.
"""

from __future__ import annotations

from django.db import connection, transaction

from core.errors import Conflict, InvalidInput
from core.services import audit_record
from inventory.choices import ProvisionState
from inventory.models import Node, Pool
from inventory.reports import HOSTNAME_RE


def node_agent_register(
    *, pool: Pool, hostname: str, labels: dict[str, str], actor: str
) -> tuple[Node, bool]:
    """The node of `hostname` in `pool` (made when new) and whether it was made; CONFLICT in another pool.

    A node a fleet file declared is taken over by its agent as it is: its
    labels stay, and only the delivery moves to the agent.
    """
    if HOSTNAME_RE.fullmatch(hostname) is None:
        raise InvalidInput.field("hostname", f"must match {HOSTNAME_RE.pattern}")
    with transaction.atomic():
        node, created = Node.objects.get_or_create(
            hostname=hostname,
            defaults={
                "pool": pool,
                "provision_state": ProvisionState.DISCOVERED,
                "labels": labels,
                "agent": True,
            },
        )
        if node.pool_id != pool.pk:
            raise Conflict(
                f"{hostname} is registered in another pool",
                [{"field": "hostname", "message": "registered in another pool"}],
            )
        took_over = not created and not node.agent
        if took_over:
            Node.objects.filter(pk=node.pk).update(agent=True)
            node.agent = True
        if created or took_over:
            audit_record(
                actor=actor,
                action="node.agent-registered",
                subject_type="node",
                subject_id=node.pk,
                data={"hostname": hostname, "pool": pool.pk, "created": created},
            )
    return node, created


def node_heartbeat(*, node_id: str) -> bool:
    """The agent is alive: one statement. False when the node is not connected (a report reconnects it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE inventory_node SET last_heartbeat_at = compute_now()"
            " WHERE id = %s AND connectivity = 'connected'",
            [node_id],
        )
        return cursor.rowcount == 1
